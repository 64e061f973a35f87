#!/usr/bin/env bash
# Installs the Debian packages in .ci/packages.txt that are missing (needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=$(grep -v '^#' .ci/packages.txt | grep -v '^$' | tr '\n' ' ')
missing=""
for p in $pkgs; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
# Node.js/npm (JavaScript test clients, tokenizer oracle): a machine may already carry them
# outside Debian's packaging (e.g. NodeSource); only ask apt for them when the commands are absent.
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "ds41 deps: installing$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
