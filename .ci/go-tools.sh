#!/usr/bin/env bash
# Builds the Go tools the Prometheus mixin, Alertmanager and OTLP tests run, once per
# machine: promtool and prometheus (v0.316.0), alertmanager (v0.35.0), an OpenTelemetry
# Collector (v0.161.0: OTLP receiver, file and debug exporters, .ci/otelcol-builder.yaml),
# and helm (v3.22.0, for the chart's tests), from the Go module proxy into a cache outside
# the clone: REPLAG_TOOLS_CACHE, default /var/cache/replag-tools. The binaries go under
# its go/ (helm under bin/, where .ci/container-tests looks too), and Go's own module and
# build caches under its go-mod/ and go-build/ (unless GOMODCACHE or GOCACHE are set), so
# that one directory is the whole of what a warm machine has and a cold one lacks: a cold
# build can be timed beside the warm cache, without touching it, with
#
#   REPLAG_TOOLS_CACHE=$(mktemp -d) .ci/run
#
# A binary already there is not built again. Prints the env vars the tests read
# (REPLAG_PROMTOOL, REPLAG_PROMETHEUS, REPLAG_ALERTMANAGER, REPLAG_OTELCOL, REPLAG_HELM) as
# `export` lines; a tool that cannot be built is left out, and its tests skip saying so.
#
#   eval "$(bash .ci/go-tools.sh)"
set -uo pipefail

PROMETHEUS_VERSION=v0.316.0
ALERTMANAGER_VERSION=v0.35.0
OTELCOL_VERSION=v0.161.0
HELM_VERSION=v3.22.0
cache="${REPLAG_TOOLS_CACHE:-/var/cache/replag-tools}"
tools="$cache/go"
helm_dir="$cache/bin"
export GOMODCACHE="${GOMODCACHE:-$cache/go-mod}" GOCACHE="${GOCACHE:-$cache/go-build}"
manifest="$(cd "$(dirname "$0")" && pwd)/otelcol-builder.yaml"

if ! command -v go >/dev/null 2>&1; then
  echo "go-tools: no Go toolchain: promtool, prometheus, alertmanager not built" >&2
  exit 0
fi
mkdir -p "$tools" || { echo "go-tools: cannot create $tools" >&2; exit 0; }
log="$tools/build.log"

# A module's source, copied writable (the module cache is read-only), for a build that
# needs files its release process makes (web UI assets).
module_copy() {
  local module=$1 version=$2 dir
  dir=$(cd "$tools" && go mod download -json "$module@$version" 2>>"$log" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || return 1
  local copy="$tools/src/${module##*/}@$version"
  rm -rf "$copy" && mkdir -p "$tools/src" && cp -r "$dir" "$copy" && chmod -R u+w "$copy" \
    && echo "$copy"
}

build_promtool() {
  local out="$tools/prometheus-$PROMETHEUS_VERSION/promtool"
  [ -x "$out" ] && { echo "$out"; return 0; }
  echo "go-tools: building promtool $PROMETHEUS_VERSION (once per machine)" >&2
  GOBIN="$(dirname "$out")" nice go install \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" >>"$log" 2>&1 \
    && echo "$out"
}

build_prometheus() {
  local out="$tools/prometheus-$PROMETHEUS_VERSION/prometheus"
  [ -x "$out" ] && { echo "$out"; return 0; }
  echo "go-tools: building prometheus $PROMETHEUS_VERSION (once per machine)" >&2
  # Without the builtinassets tag the web UI is read from disk and nothing is embedded, so
  # `go install` builds v0.316.0 as it is (so it did here). The writable-copy build below
  # is only a fallback for a version whose embed patterns want web assets (not exercised).
  GOBIN="$(dirname "$out")" nice go install \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" >>"$log" 2>&1 \
    && { echo "$out"; return 0; }
  local src
  src=$(module_copy github.com/prometheus/prometheus "$PROMETHEUS_VERSION") || return 1
  mkdir -p "$src/web/ui/static" && touch "$src/web/ui/static/.keep"
  (cd "$src" && nice go build -o "$out" ./cmd/prometheus) >>"$log" 2>&1 && echo "$out"
  rm -rf "$src"
}

build_alertmanager() {
  local out="$tools/alertmanager-$ALERTMANAGER_VERSION/alertmanager"
  [ -x "$out" ] && { echo "$out"; return 0; }
  echo "go-tools: building alertmanager $ALERTMANAGER_VERSION (once per machine)" >&2
  local src
  src=$(module_copy github.com/prometheus/alertmanager "$ALERTMANAGER_VERSION") || return 1
  # ui/web.go embeds ui/app/dist, which npm fills in Alertmanager's release process; the
  # API the sink posts to does not need it.
  mkdir -p "$src/ui/app/dist" && touch "$src/ui/app/dist/index.html"
  mkdir -p "$(dirname "$out")"
  (cd "$src" && nice go build -o "$out" ./cmd/alertmanager) >>"$log" 2>&1 && echo "$out"
  rm -rf "$src"
}

build_otelcol() {
  local dir="$tools/otelcol-$OTELCOL_VERSION" out
  out="$dir/otelcol-replag"
  [ -x "$out" ] && { echo "$out"; return 0; }
  echo "go-tools: building otelcol $OTELCOL_VERSION (once per machine)" >&2
  GOBIN="$dir/bin" nice go install "go.opentelemetry.io/collector/cmd/builder@$OTELCOL_VERSION" \
    >>"$log" 2>&1 || return 1
  # The builder writes the distribution's sources into output_path, then builds them.
  sed "s|^dist:|dist:\n  output_path: $dir|" "$manifest" >"$dir/builder.yaml"
  nice "$dir/bin/builder" --config "$dir/builder.yaml" >>"$log" 2>&1 \
    && [ -x "$out" ] && echo "$out"
}

build_helm() {
  local out="$helm_dir/helm"
  [ -x "$out" ] && { echo "$out"; return 0; }
  echo "go-tools: building helm $HELM_VERSION (once per machine)" >&2
  mkdir -p "$helm_dir" && GOBIN="$helm_dir" nice go install \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >>"$log" 2>&1 && echo "$out"
}

for tool in promtool prometheus alertmanager otelcol helm; do
  var="REPLAG_$(echo "$tool" | tr '[:lower:]' '[:upper:]')"
  if path=$("build_$tool") && [ -x "$path" ]; then
    echo "export $var=$path"
  else
    echo "go-tools: $tool could not be built (see $log): its tests skip" >&2
  fi
done
