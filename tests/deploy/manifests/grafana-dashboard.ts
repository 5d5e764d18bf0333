// The type check-dashboards.mjs checks every dashboards/*.json against: the Dashboard of
// @grafana/schema (the package's main entry: veneer/dashboard.types over
// raw/dashboard/x/dashboard_types.gen, the classic dashboard JSON model of schemaVersion 41,
// Grafana 12.0; not the Kubernetes-style v0alpha1/v1beta1/v2alpha1 resources under
// schema/dashboard/), with two departures, both where the TypeScript type rejects JSON that
// Grafana's schema and Grafana itself accept:
//   - String enums. The schema's string disjunctions (a field color mode, a thresholds mode,
//     a value mapping type, a special value match) are TypeScript string enums, and a string
//     literal is never assignable to a string enum, even the enum's own value: the JSON
//     "mode": "absolute" fails against ThresholdsMode although "absolute" is
//     ThresholdsMode.Absolute. AsJson<> below replaces each string enum by the union of its
//     values ("absolute" | "percentage"): the same values pass and any other still fails.
//     Nothing else changes (numeric enums already take their values as numbers).
//   - definition on a templating variable. Grafana writes it for query variables (the query
//     as text; dashboard-scene's sceneVariablesSetToVariables) and reads it back
//     (createSceneVariableFromVariableModel), and the v2 schema has it
//     (QueryVariableSpec.definition), but the v1 VariableModel lacks it (still in
//     @grafana/schema 13.2.3). Allowed as an optional string on templating variables only.
import type { Dashboard, VariableModel } from "@grafana/schema";

// T as JSON can spell it: every string enum replaced by the union of its values.
type AsJson<T> = 0 extends 1 & T ? T  // any stays any
  : T extends string ? `${T}`
  : T extends readonly (infer U)[] ? AsJson<U>[]
  : T extends object ? { [K in keyof T]: AsJson<T[K]> }
  : T;

export interface TemplatingVariable extends VariableModel {
  /** The query as text (query variables); written and read by Grafana, not in VariableModel. */
  definition?: string;
}

export interface DashboardModel extends Omit<Dashboard, "templating"> {
  templating?: { list?: TemplatingVariable[] };
}

export type DashboardJson = AsJson<DashboardModel>;
