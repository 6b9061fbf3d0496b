#!/usr/bin/env bash
# setup.sh - install everything coderq needs on Debian 12: compilers (gcc;
# clang with its libFuzzer and sanitizer runtimes for the fuzz build) and
# -dev packages, PostgreSQL, Java 17 and Maven, Debian's Python kernel
# stack, bubblewrap, kcat, Node.js with npm, Chromium (the run report's
# browser test loads its pages headless), openssl (services.sh --secure
# makes its test CA with it), the Noto CJK fonts (kernels' figures), and
# python3-jsonschema, python3-confluent-kafka and python3-psycopg (the
# schemas' checks and the Python example client), python3-pyflakes
# (test.sh's lint of our Python), prometheus (promtool and the server
# the metrics test scrapes with), python3-venv; then fetch the pinned
# Apache Kafka broker jars with Maven into the cache folder, and install
# the tests' Python oracles from PyPI (scripts/requirements-tools.txt)
# into the venv .cache/venv. Idempotent: a second run checks and does
# nothing slow.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

PACKAGES=(
        build-essential cmake pkg-config clang-format valgrind
        clang libclang-rt-14-dev
        librdkafka-dev libcurl4-openssl-dev libjansson-dev libpq-dev
        check libsubunit-dev libssl-dev zlib1g-dev
        postgresql postgresql-contrib
        openjdk-17-jre-headless maven
        python3-ipykernel python3-jupyter-client python3-zmq python3-numpy
        python3-pandas python3-matplotlib python3-nbformat python3-scipy
        bubblewrap kcat util-linux procps iproute2 curl ca-certificates
        chromium
        openssl fonts-noto-cjk
        python3-jsonschema python3-confluent-kafka python3-psycopg
        python3-pyflakes python3-venv
        prometheus
        hyperfine
)

# One dpkg-query for all packages keeps the no-op run fast.
missing=()
installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${PACKAGES[@]}" 2>/dev/null |
        awk '$NF == "installed" && $(NF-1) == "ok" { print $1 }' || true)
for p in "${PACKAGES[@]}"; do
        grep -qxF "$p" <<<"$installed" || missing+=("$p")
done
# Node.js may come from another source that already bundles npm (Debian's
# npm package then conflicts); only install what is absent.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -gt 0 ]; then
        cq_say "installing Debian packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        cq_as_root apt-get update -qq
        cq_as_root apt-get install -y -qq --no-install-recommends \
                "${missing[@]}" >/dev/null
else
        cq_say "Debian packages: all present"
fi

# The Kafka broker: the kafka_2.13 jar and its runtime dependencies.
if [ -f "$CQ_KAFKA_LIBS/.complete" ]; then
        cq_say "Kafka $CQ_KAFKA_VERSION jars: cached in $CQ_KAFKA_LIBS"
else
        cq_say "fetching Kafka $CQ_KAFKA_VERSION jars with Maven"
        rm -rf "$CQ_KAFKA_LIBS"
        mkdir -p "$CQ_KAFKA_LIBS"
        mvn -q -B -f "$CQ_ROOT/scripts/kafka/pom.xml" \
                -Dkafka.version="$CQ_KAFKA_VERSION" \
                dependency:copy-dependencies -DincludeScope=runtime \
                -DoutputDirectory="$CQ_KAFKA_LIBS" >"$CQ_CACHE_DIR/maven.log" 2>&1 ||
                cq_die "Maven could not fetch Kafka; see $CQ_CACHE_DIR/maven.log"
        ls "$CQ_KAFKA_LIBS"/kafka_2.13-"$CQ_KAFKA_VERSION".jar >/dev/null
        touch "$CQ_KAFKA_LIBS/.complete"
fi

# Importing the kernel stack takes a second: check it once per install.
py_stamp=$CQ_CACHE_DIR/python-stack.ok
if [ ${#missing[@]} -gt 0 ] || [ ! -f "$py_stamp" ]; then
        /usr/bin/python3 -c 'import ipykernel, numpy, pandas, matplotlib, nbformat' ||
                cq_die "Debian's python3 lacks ipykernel/numpy/pandas/matplotlib/nbformat"
        /usr/bin/python3 -c 'import jsonschema, confluent_kafka, psycopg' ||
                cq_die "Debian's python3 lacks jsonschema/confluent_kafka/psycopg"
        mkdir -p "$CQ_CACHE_DIR"
        touch "$py_stamp"
fi
# The oracles of the tests, from PyPI (scripts/requirements-tools.txt),
# in a venv that sees Debian's packages; reinstalled when the pins change.
venv=$CQ_CACHE_DIR/venv
req=$CQ_ROOT/scripts/requirements-tools.txt
if ! cmp -s "$req" "$venv/requirements.txt" 2>/dev/null; then
        cq_say "installing the test oracles (PyPI) into $venv"
        rm -rf "$venv"
        /usr/bin/python3 -m venv --system-site-packages "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check \
                -r "$req" >"$CQ_CACHE_DIR/pip.log" 2>&1 ||
                cq_die "pip could not install $req; see $CQ_CACHE_DIR/pip.log"
        cp "$req" "$venv/requirements.txt"
fi
# The Helm chart's checks (tests/check_deploy.py): helm, built from its Go
# module at a pinned version into the cache folder (Go 1.26 or later:
# helm 4's go.mod asks for it, and no other toolchain is fetched), and the
# JSON Schemas of the custom resources it renders, from npm at the
# versions of scripts/npm-tools/package-lock.json; kubernetes-validate
# comes with the venv above. Each is redone only when its pin changes, so
# a second run does nothing and needs no network.
helm_version=v4.3.2
helm_bin=$CQ_CACHE_DIR/go/bin/helm
# `go install` leaves the release's patch level out of `helm version`:
# the module version it was built from is what go reads back.
go_bin=$(command -v go || echo /usr/local/go/bin/go)
helm_built() {
        [ -x "$go_bin" ] && [ -x "$helm_bin" ] &&
                "$go_bin" version -m "$helm_bin" 2>/dev/null |
                awk '$1 == "mod" { print $3 }'
}
if [ "$(helm_built)" != "$helm_version" ]; then
        [ -x "$go_bin" ] ||
                cq_die "helm $helm_version is built with Go 1.26 or later, which is not installed"
        cq_say "building helm $helm_version with $("$go_bin" env GOVERSION) into ${helm_bin%/*}"
        mkdir -p "${helm_bin%/*}"
        GOBIN=${helm_bin%/*} GOTOOLCHAIN=local \
                "$go_bin" install "helm.sh/helm/v4/cmd/helm@$helm_version" \
                >"$CQ_CACHE_DIR/helm-build.log" 2>&1 ||
                cq_die "could not build helm; see $CQ_CACHE_DIR/helm-build.log"
fi
npm_dir=$CQ_CACHE_DIR/npm
npm_lock=$CQ_ROOT/scripts/npm-tools/package-lock.json
if ! cmp -s "$npm_lock" "$npm_dir/.tools-lock.json" 2>/dev/null; then
        cq_say "installing the custom resources' schemas (npm) into $npm_dir"
        mkdir -p "$npm_dir"
        cp "$CQ_ROOT/scripts/npm-tools/package.json" "$npm_lock" "$npm_dir/"
        (cd "$npm_dir" && npm ci --no-audit --no-fund --cache "$npm_dir" \
                --loglevel=error) >"$CQ_CACHE_DIR/npm-tools.log" 2>&1 ||
                cq_die "npm could not install scripts/npm-tools; see $CQ_CACHE_DIR/npm-tools.log"
        cp "$npm_lock" "$npm_dir/.tools-lock.json"
fi
cq_say "setup complete"
