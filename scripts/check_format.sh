#!/usr/bin/env bash
# The tree's C, C++ and CUDA sources are formatted as .clang-format says (issue 13).
#
#   scripts/check_format.sh        # lists every file clang-format would change; exit 1 if any
#   scripts/check_format.sh --fix  # formats them in place
#
# Runs as a CTest test (format:), so the README's test command fails on unformatted
# code. clang-format-14 comes from Debian (scripts/setup.sh installs it): one version,
# because another one formats some constructs differently.
set -euo pipefail
cd "$(dirname "$0")/.."
formatter=$(command -v clang-format-14 || true)
if [[ -z "$formatter" ]]; then
    echo "check_format: clang-format-14 is not installed (bash scripts/setup.sh installs it)" >&2
    exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files -- '*.c' '*.cpp' '*.h' '*.hpp' '*.cu')
else
    mapfile -t files < <(find core fsd loader gui cli remote tests bench -type f \
        \( -name '*.c' -o -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' \) | sort)
fi
if [[ "${1:-}" == "--fix" ]]; then
    "$formatter" -i "${files[@]}"
    exit 0
fi
unformatted=()
for f in "${files[@]}"; do
    [[ -f "$f" ]] || continue  # deleted in the work tree, not yet in the index
    if ! "$formatter" --dry-run -Werror "$f" >/dev/null 2>&1; then unformatted+=("$f"); fi
done
if ((${#unformatted[@]} > 0)); then
    echo "check_format: ${#unformatted[@]} of ${#files[@]} files are not formatted (.clang-format):" >&2
    printf '  %s\n' "${unformatted[@]}" >&2
    echo "run: bash scripts/check_format.sh --fix" >&2
    exit 1
fi
echo "check_format: ${#files[@]} files formatted"
