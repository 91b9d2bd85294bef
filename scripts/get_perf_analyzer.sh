#!/usr/bin/env bash
# Fetch a perf_analyzer binary that runs on Debian 12 (glibc 2.36) into .cache/perf_analyzer/.
#
# tritonclient >= 2.61 no longer bundles perf_analyzer and 2.52-2.60 need glibc 2.38; the 2.51.0 wheel carries
# one that runs here. It links libcudart even on a CPU-only machine, so the libcudart of the
# nvidia-cuda-runtime-cu12 wheel goes next to it. It also needs Debian's libb64-0d (apt-get install libb64-0d).
#
# Usage: scripts/get_perf_analyzer.sh [PYTHON]    (PYTHON defaults to .venv/bin/python, then python3)
# Afterwards: .cache/perf_analyzer/perf_analyzer (a wrapper that sets LD_LIBRARY_PATH) runs the binary.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.cache/perf_analyzer"
python="${1:-}"
if [[ -z "$python" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then python="$root/.venv/bin/python"; else python="python3"; fi
fi

if [[ -x "$dest/perf_analyzer" && -x "$dest/bin/perf_analyzer" ]]; then
    echo "perf_analyzer already in $dest"
    exit 0
fi

if ! ldconfig -p 2>/dev/null | grep -q 'libb64.so.0d'; then
    echo "warning: libb64.so.0d not found; install Debian's libb64-0d (sudo apt-get install libb64-0d)" >&2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
    --dest "$work" "tritonclient==2.51.0"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --dest "$work" "nvidia-cuda-runtime-cu12<13"

mkdir -p "$dest/bin" "$dest/lib"
# .cache/ holds only downloads: keep it out of git even where .gitignore does not name it
[[ -e "$root/.cache/.gitignore" ]] || echo "*" > "$root/.cache/.gitignore"
"$python" - "$work" "$dest" <<'EOF'
import glob
import os
import sys
import zipfile

work, dest = sys.argv[1], sys.argv[2]


def extract(wheel_pattern: str, member_suffix: str, target: str) -> None:
    wheel = glob.glob(os.path.join(work, wheel_pattern))[0]
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(member_suffix)]
        if not names:
            raise SystemExit(f"{wheel}: no member ending in {member_suffix}")
        with archive.open(names[0]) as src, open(target, "wb") as out:
            out.write(src.read())
    os.chmod(target, 0o755)


extract("tritonclient-2.51.0-*.whl", "data/bin/perf_analyzer", os.path.join(dest, "bin", "perf_analyzer"))
extract("nvidia_cuda_runtime_cu12-*.whl", "cuda_runtime/lib/libcudart.so.12", os.path.join(dest, "lib",
                                                                                          "libcudart.so.12"))
EOF

cat > "$dest/perf_analyzer" <<'EOF'
#!/usr/bin/env bash
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/bin/perf_analyzer" "$@"
EOF
chmod 755 "$dest/perf_analyzer"

if ! "$dest/perf_analyzer" --version >/dev/null 2>&1 && ! "$dest/perf_analyzer" --help >/dev/null 2>&1; then
    echo "perf_analyzer was unpacked into $dest but does not start; run $dest/perf_analyzer --help" >&2
    exit 1
fi
echo "perf_analyzer ready: $dest/perf_analyzer"
