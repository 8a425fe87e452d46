#!/usr/bin/env bash
# layers.sh OBJ... - check the layering docs/architecture.md states.
#
#  1. Includes: every #include "..." in a source folder, and every
#     #include <...> that names a folder of the repository (it compiles
#     through -I.), names a header of a folder that folder may use (the
#     table below). A quoted header without a '/' is looked up next to the
#     file, then in include/ (-Iinclude). Untracked files that git does not
#     ignore are checked too: a new file breaks the rules before its commit.
#  2. Calls: among the given objects (the library's and the tools'), no two
#     files call each other, directly or through others: a file uses
#     a symbol another defines only one way round (tsort finds the loops).
#
# Prints each violation and exits 1 if there is any. make test runs it on
# the debug build's objects; it needs only coreutils, grep, awk and nm.
set -u
cd "$(dirname "$0")/.."

# folder: the folders (or single headers) its files may include, besides
# its own. Order matters: the first folder that prefixes a path wins.
rules=(
    "engine/model/cuda:include engine/model kernels vmm"
    "engine/model:include kernels vmm"
    "engine/core:include engine/model kernels offload vmm"
    "engine/serve:include engine/model/gguf.h engine/model/tok.h"
    "kernels:include"
    "offload:include vmm"
    "vmm:include"
    "include:"
    "tools:include engine/model engine/serve/http.h engine/serve/req.h kernels"
)

bad=0
allowed_for() { # folder of a file -> its allowed list, or "*" (no rule: tests/)
    local f=$1 r
    for r in "${rules[@]}"; do
        case "$f" in "${r%%:*}"/*) echo "${r%%:*} ${r#*:}"; return ;; esac
    done
    echo "*"
}

src_dirs=('include/*' 'vmm/*' 'offload/*' 'kernels/*' 'engine/*' 'tools/*')
for f in $({ git ls-files "${src_dirs[@]}"; git ls-files --others --exclude-standard "${src_dirs[@]}"; } |
           grep -E '\.(c|h|cu|cuh)$' | sort -u); do
    [ -e "$f" ] || continue # deleted, not yet committed
    allow=$(allowed_for "$f")
    [ "$allow" = "*" ] && continue
    dir=$(dirname "$f")
    while IFS= read -r line; do
        inc=${line#?} # q: "quoted", a: <angle> naming a folder of the repository
        if [ "${line:0:1}" = q ]; then shown="\"$inc\""; else shown="<$inc>"; fi
        path=$inc
        if [[ $inc != */* ]]; then
            if [ -e "$dir/$inc" ]; then path="$dir/$inc"; else path="include/$inc"; fi
        fi
        ok=0
        for a in $allow; do
            case "$path" in "$a"|"$a"/*) ok=1; break ;; esac
        done
        if [ "$ok" -eq 0 ]; then
            echo "layers: $f includes $shown ($path): $dir may include only: $allow"
            bad=1
        fi
    done < <(sed -n -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/q\1/p' \
                    -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\(\(include\|vmm\|offload\|kernels\|engine\|tools\|tests\)\/[^>]*\)>.*/a\1/p' \
                    "$f")
done

# Calls: "user definer" for every undefined symbol another object defines.
if [ "$#" -gt 0 ]; then
    edges=$(for o in "$@"; do
                nm -g --defined-only "$o" | awk -v o="$o" 'NF == 3 {print "D", o, $3}'
                nm -u "$o" | awk -v o="$o" '{print "U", o, $NF}'
            done | awk '$1 == "D" {def[$3] = $2; next}
                        {use[NR] = $2 " " $3}
                        END {for (i in use) {split(use[i], a, " ");
                                 if ((a[2] in def) && def[a[2]] != a[1]) print a[1], def[a[2]]}}' |
            sort -u)
    loops=$(printf '%s\n' "$edges" | tsort 2>&1 >/dev/null)
    if [ -n "$loops" ]; then
        echo "layers: files that call each other (a loop of calls between objects):"
        printf '%s\n' "$loops" | sed 's/^/  /'
        bad=1
    fi
fi

[ "$bad" -eq 0 ] && echo "layers: includes follow the layer table; no call loops among $# objects"
exit "$bad"
