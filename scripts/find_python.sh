#!/usr/bin/env bash
# Print the path of the first Python found for the versions given (newest first, e.g.
# `scripts/find_python.sh 3.13 3.12`): on PATH as pythonX.Y, else among pyenv's versions.
# Exit 1, printing nothing, when there is none. A pyenv shim on PATH that has no such
# version selected does not count: each candidate must run.
set -u
root="${PYENV_ROOT:-$HOME/.pyenv}"
for version in "$@"; do
    candidates=("$(command -v "python$version" 2>/dev/null)")
    # pyenv's folders are named by full version (3.13.0, 3.13.1, ...): the newest first.
    while IFS= read -r path; do candidates+=("$path"); done < <(ls -d "$root"/versions/"$version".*/bin/"python$version" 2>/dev/null | sort -V -r)
    for candidate in "${candidates[@]}"; do
        if [ -n "$candidate" ] && "$candidate" -c 'import sys, venv' >/dev/null 2>&1; then
            echo "$candidate"
            exit 0
        fi
    done
done
exit 1
