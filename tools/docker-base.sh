#!/usr/bin/env bash
# tools/docker-base.sh: gives the Docker daemon the Debian 12 base images that
# deploy/docker/Dockerfile and prometheus.Dockerfile start from (debian:bookworm and
# debian:bookworm-slim) without a registry: a minimal Debian 12 root file system made with
# `debootstrap --variant=minbase` from this machine's apt mirror, imported with
# `docker import` under both names (apt-get inside a `docker build` then reaches that mirror).
# The root file system is kept as a tar file in /var/cache/parasync, so the images come back
# in seconds when the daemon lost them; the debootstrap itself takes about a minute.
# Where Docker Hub is reachable, `docker pull debian:bookworm debian:bookworm-slim` does the
# same job.
#
# Usage: tools/docker-base.sh [--force]   (--force: make the root file system anew)
# Needs root, debootstrap (tools/install-deps.sh debootstrap) and a running Docker daemon.
# Exit 0: both images present; 1: something failed (one line says what); 2: bad arguments.
set -euo pipefail

prog="docker-base"
force=0
case ${1:-} in
  "") ;;
  --force) force=1 ;;
  -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "$prog: unknown argument '$1' (--force)" >&2; exit 2 ;;
esac
docker=/usr/bin/docker
[[ -x $docker ]] || docker=$(command -v docker) || { echo "$prog: no docker client" >&2; exit 1; }
cache=/var/cache/parasync
tarball=$cache/debian-bookworm-minbase.tar

have_images() {
  "$docker" image inspect debian:bookworm debian:bookworm-slim >/dev/null 2>&1
}
if ((force == 0)) && have_images; then
  echo "$prog: debian:bookworm and debian:bookworm-slim are present"
  exit 0
fi

# The Debian mirror apt uses here (deb822 .sources or a classic sources.list line): its main
# archive (security=0) or its security archive (security=1).
mirror() {
  local security=$1 uri filter=(grep -v security)
  ((security)) && filter=(grep security)
  uri=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' |
    "${filter[@]}" | head -n 1) || true
  [[ -n $uri ]] || uri=$(grep -hsE '^deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
    awk '{print $2}' | "${filter[@]}" | head -n 1) || true
  if ((security)); then echo "${uri:-http://deb.debian.org/debian-security}"; else
    echo "${uri:-http://deb.debian.org/debian}"; fi
}

if ((force == 1)) || [[ ! -s $tarball ]]; then
  command -v debootstrap >/dev/null 2>&1 ||
    { echo "$prog: debootstrap is not installed (tools/install-deps.sh debootstrap)" >&2; exit 1; }
  mkdir -p "$cache"
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$root" "$tarball.part"' EXIT
  started=$SECONDS
  url=$(mirror 0)
  echo "$prog: debootstrap --variant=minbase bookworm from $url (about a minute)"
  if ! debootstrap --variant=minbase bookworm "$root" "$url" >"$root.log" 2>&1; then
    tail -n 5 "$root.log" >&2
    echo "$prog: debootstrap failed (log above)" >&2
    rm -f "$root.log"
    exit 1
  fi
  rm -f "$root.log"
  # As Debian's own images: the point releases' updates and the security archive too.
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
    "$url" "$url" "$(mirror 1)" >"$root/etc/apt/sources.list"
  tar -C "$root" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
  echo "$prog: root file system made in $((SECONDS - started)) s, kept in $tarball"
fi
"$docker" import "$tarball" parasync-debian-base:bookworm >/dev/null
# Only the names that are missing (all with --force): a debian:bookworm pulled from a
# registry stays.
for tag in debian:bookworm debian:bookworm-slim; do
  if ((force == 1)) || ! "$docker" image inspect "$tag" >/dev/null 2>&1; then
    "$docker" tag parasync-debian-base:bookworm "$tag"
    echo "$prog: $tag is the debootstrap image from $tarball"
  fi
done
have_images || { echo "$prog: the images are not there after the import" >&2; exit 1; }
