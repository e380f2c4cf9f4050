#!/usr/bin/env bash
# Renders the chart charts/socklb with the real Helm engine, offline (a client-side dry-run
# install, what `helm template` does), and prints the manifest on stdout.
#   bash charts/render.sh                 the defaults
#   bash charts/render.sh '{"privileged": true}'   with these values (JSON) over them
# The privileged tests read the agent's securityContext from this output, so that they run
# the agent exactly as the chart does.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
die() {
    echo "error: $*" >&2
    exit 1
}
# The tools' installer talks on stdout; the manifest is the only output here.
# shellcheck source=charts/helm-tools.sh
. charts/helm-tools.sh >&2
trap 'rm -rf "$HELM_HOME"' EXIT
VALUES=${1:-"{}"} CHART=$ROOT/charts/socklb python3 - <<'PY'
import json, os

import helm_python as helm

with helm.Config(namespace="kube-system", storage_driver="memory") as config:
    release = config.install(os.environ["CHART"], "socklb", json.loads(os.environ["VALUES"]),
                             namespace="kube-system", dry_run="client")
print(release["manifest"])
PY
