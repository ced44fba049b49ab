#!/usr/bin/env bash
# Installs the Python peers the fusion benchmark compares against (Debian's packages).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
missing=()
for p in python3-numpy python3-numexpr python3-torch; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
