# A Debian 12 machine with systemd as PID 1 and the runtime packages of parasync, for
# tests/deploy/systemd_test.py: it runs deploy/systemd's units under a real systemd (not only
# `systemd-analyze verify`). Nothing of the project is in the image: the test copies the
# binaries, parasync-entrypoint and the units in with `docker cp`, as docs/deploying.md
# installs them on a host. No build context is needed:
#   docker build -t parasync-systemd-test - < deploy/docker/systemd-test.Dockerfile
# Run it (what the test does on a cgroup v1 host; it tries --privileged too, for cgroup v2):
#   docker run -d --cap-add ALL --security-opt seccomp=unconfined --cgroupns=host \
#     -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock --tmpfs /tmp \
#     parasync-systemd-test
# (--privileged fails with "unable to apply caps" where dockerd itself lacks a capability,
# e.g. CAP_SYS_RESOURCE; then --cap-drop the missing ones.)
ARG DEBIAN_RELEASE=bookworm
FROM debian:${DEBIAN_RELEASE}
ENV DEBIAN_FRONTEND=noninteractive
# The runtime packages are deploy/docker/Dockerfile's runtime-base list; curl for /healthz.
RUN apt-get update \
 && apt-get install -y --no-install-recommends systemd systemd-sysv dbus curl \
      libzmq5 libprometheus-cpp-core1.0 libspdlog1.10 libfmt9 \
      libdnnl2 libgomp1 libsnappy1v5 libbz2-1.0 liblz4-1 libzstd1 zlib1g \
      dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*
# Only what a server boot needs: no getty, no udev-triggered units, no timers, no resolved.
RUN systemctl mask getty.target console-getty.service systemd-udevd.service \
      systemd-udev-trigger.service systemd-udev-settle.service systemd-timesyncd.service \
      systemd-logind.service apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
      e2scrub_all.timer fstrim.timer systemd-tmpfiles-clean.timer \
      sys-kernel-debug.mount sys-kernel-tracing.mount sys-fs-fuse-connections.mount \
      dev-hugepages.mount \
 && systemctl set-default multi-user.target
ENV container=docker
STOPSIGNAL SIGRTMIN+3
# Shared mount propagation first. systemd makes / shared (MS_REC|MS_SHARED) at boot on a host,
# but not in a container (it leaves that to the container manager), and Docker's mounts are
# private. Then LoadCredential= breaks: systemd 252 builds a unit's credentials directory in a
# child mount namespace and moves it onto /run/credentials/UNIT, which the manager (and the
# service) only see through propagation, so the service finds an empty root-owned 0700
# directory and parasync-entrypoint stops with "CURVE key pair ... is missing or unreadable".
CMD ["/bin/sh", "-c", "mount --make-rshared / && exec /lib/systemd/systemd"]
