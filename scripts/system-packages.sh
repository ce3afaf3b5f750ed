#!/usr/bin/env bash
# Debian packages the test suite uses beyond Python: HAProxy, the load balancer in front
# of Ferry replicas in tests/e2e/test_load_balancer.py, and Prometheus (with promtool),
# which scrapes Ferry in tests/integration/test_prometheus.py; podman, runc and
# debootstrap, which build and run Ferry's image in tests/e2e/test_image.py. Installs what is missing
# when this runs as root with apt-get (CI, a container); otherwise says which tests will
# skip.
# Never fails the build: the tests that need a package skip, naming it.
set -uo pipefail

missing=()
command -v haproxy >/dev/null || missing+=(haproxy)
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
((${#missing[@]} == 0)) && exit 0

if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]} (apt-get)"
    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
        exit 0
    fi
fi
echo "note: ${missing[*]} not installed (apt-get install ${missing[*]}):" \
    "the load-balancer, Prometheus or image tests will skip" >&2
