# A base image with Docker's engine and Compose, for sandboxes started with containers=True (gvisor tier).
# Build it on a Debian trixie image (Docker 26, Compose v2 as the `docker compose` plugin):
#   sandtree bootstrap debian:trixie --tag debian:trixie
#   sandtree build -f recipes/docker.Dockerfile --tag docker:trixie --network deb.debian.org recipes
# iptables-legacy: gVisor's kernel answers the legacy iptables interface, not nftables, and dockerd's
# embedded DNS (service names on a Compose network) sets its rules with `iptables`.
FROM debian:trixie
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      docker.io docker-cli docker-compose iptables iproute2 ca-certificates \
 && update-alternatives --set iptables /usr/sbin/iptables-legacy \
 && update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
