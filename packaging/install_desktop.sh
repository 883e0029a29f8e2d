#!/usr/bin/env bash
# Puts SpecChat in the desktop's applications menu, for this user only (freedesktop menus: GNOME, KDE,
# Xfce, ...): the .desktop entry into $XDG_DATA_HOME/applications (default ~/.local/share) and the icons
# into its icons/hicolor theme. It points at an executable given by absolute path:
#   bash packaging/install_desktop.sh              the venv's .venv/bin/specchat (after install.sh)
#   bash packaging/install_desktop.sh --bundle     the bundle's dist/SpecChat/specchat (after build_bundle.sh)
#   bash packaging/install_desktop.sh --exec PATH  any other specchat executable
#   bash packaging/install_desktop.sh --uninstall  removes what it installed
# Moving the checkout or the bundle afterwards breaks the entry: run it again.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exe="$root/.venv/bin/specchat"
uninstall=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) exe="$root/dist/SpecChat/specchat" ;;
        --exec) [ $# -ge 2 ] || { echo "--exec needs a path" >&2; exit 2; }; exe="$2"; shift ;;
        --uninstall) uninstall=1 ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

data="${XDG_DATA_HOME:-$HOME/.local/share}"
apps="$data/applications"
hicolor="$data/icons/hicolor"
sizes="16 32 48 64 128 256 512"

refresh() {  # optional caches; menus also pick the files up without them
    if command -v update-desktop-database >/dev/null; then update-desktop-database -q "$apps" 2>/dev/null || true; fi
    if command -v gtk-update-icon-cache >/dev/null && [ -f "$hicolor/index.theme" ]; then
        gtk-update-icon-cache -q -t -f "$hicolor" 2>/dev/null || true
    fi
}

if [ "$uninstall" = 1 ]; then
    rm -f "$apps/specchat.desktop" "$hicolor/scalable/apps/specchat.svg"
    for s in $sizes; do rm -f "$hicolor/${s}x${s}/apps/specchat.png"; done
    refresh
    echo "removed SpecChat from $apps"
    exit 0
fi

case "$exe" in /*) ;; *) exe="$(pwd)/$exe" ;; esac
if [ ! -x "$exe" ]; then
    echo "no executable at $exe: run 'bash packaging/install.sh' (or build_bundle.sh for --bundle) first" >&2
    exit 1
fi
# Exec= takes the path in double quotes (spaces are fine); these characters would need escaping twice.
case "$exe" in *[\"\`\$\\%]*|*$'\n'*) echo "the path $exe has a character a .desktop Exec= line cannot hold; move it" >&2; exit 1 ;; esac

mkdir -p "$apps" "$hicolor/scalable/apps"
install -m 644 "$root/resources/icons/specchat.svg" "$hicolor/scalable/apps/specchat.svg"
for s in $sizes; do
    mkdir -p "$hicolor/${s}x${s}/apps"
    install -m 644 "$root/resources/icons/specchat-$s.png" "$hicolor/${s}x${s}/apps/specchat.png"
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
sed -e "s|^Exec=.*|Exec=\"$exe\"|" -e "s|^TryExec=.*|TryExec=$exe|" "$root/packaging/specchat.desktop" > "$tmp/specchat.desktop"
if command -v desktop-file-validate >/dev/null; then desktop-file-validate "$tmp/specchat.desktop"; fi
install -m 644 "$tmp/specchat.desktop" "$apps/specchat.desktop"
refresh
echo "installed $apps/specchat.desktop -> $exe"
