# Prometheus for compose.yaml, from Debian 12's package (prometheus 2.42), so that the compose
# cluster needs no image from Docker Hub: only a debian:bookworm-slim base and Debian's
# mirror. The project's config and rules are mounted at run time (compose.yaml), not copied.
#   docker build -f deploy/docker/prometheus.Dockerfile -t parasync-prometheus:2.42 deploy/docker
ARG DEBIAN_RELEASE=bookworm
FROM debian:${DEBIAN_RELEASE}-slim
ENV DEBIAN_FRONTEND=noninteractive
# wget: the compose healthcheck's GET of /-/ready.
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o prometheus -g prometheus -m 0755 /prometheus
USER prometheus
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", \
     "--web.listen-address=:9090"]
