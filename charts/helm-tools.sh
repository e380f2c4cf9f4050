# Sourced by charts/check.sh and charts/render.sh: installs the real Helm engine (two builds
# of Helm's Go library behind Python) and the Kubernetes schemas into $TOOLS, once, and puts
# them on PYTHONPATH. Needs $ROOT (the repository) and a `die` function.
# helm-sdkpy declares Python >= 3.12 but works on 3.11 (Debian 12's).
TOOLS=${HELM_TOOLS_DIR:-$ROOT/target/helm-sdkpy}
# Pinned: what the scripts were written and verified against.
PACKAGES="helm-sdkpy==0.1.32 helm-python-sdk==0.2.2 kubernetes-validate==1.37.0"
# Compiled parts (cffi, PyYAML, rpds) are built for one Python: part of the stamp.
STAMP="$PACKAGES $(python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])')"
if [ "$(cat "$TOOLS/.packages" 2>/dev/null)" != "$STAMP" ]; then
    python3 -m pip --version >/dev/null 2>&1 ||
        die "python3 has no pip: install it with \`apt-get install -y python3-pip\`"
    rm -rf "$TOOLS.partial"
    # shellcheck disable=SC2086 # one word per package
    python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
        --root-user-action=ignore --ignore-requires-python --target "$TOOLS.partial" $PACKAGES ||
        die "pip could not install $PACKAGES into $TOOLS.partial (PyPI must be reachable)"
    echo "$STAMP" >"$TOOLS.partial/.packages"
    rm -rf "$TOOLS"
    mv "$TOOLS.partial" "$TOOLS"
fi
export PYTHONPATH=$TOOLS
# Helm writes its cache and config under these; keep them out of $HOME.
HELM_HOME=$(mktemp -d)
export HELM_CACHE_HOME=$HELM_HOME/cache HELM_CONFIG_HOME=$HELM_HOME/config HELM_DATA_HOME=$HELM_HOME/data
export PYTHONDONTWRITEBYTECODE=1
