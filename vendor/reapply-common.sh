# The body of vendor/*/reapply.sh, shared by the vendored crates (vendor/h2, vendor/hyper): each
# crate's reapply.sh sets NAME, VERSION, SHA256, NOT_VENDORED and OURS, then sources this file
# (its usage is in vendor/h2/reapply.sh). $0 stays the crate's script, and $here its directory.
# shellcheck shell=bash

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The pinned crate, checksum verified, unpacked as $work/upstream (without NOT_VENDORED).
upstream() {
    local cache=${CARGO_HOME:-$HOME/.cargo}/registry/cache crate
    crate=$(find "$cache" -maxdepth 2 -name "$NAME-$VERSION.crate" 2>/dev/null | head -n 1 || true)
    if [ -z "$crate" ]; then
        mkdir "$work/fetch"
        printf '[package]\nname = "fetch-%s"\nversion = "0.0.0"\nedition = "2021"\n[lib]\npath = "lib.rs"\n[dependencies]\n%s = "=%s"\n' \
            "$NAME" "$NAME" "$VERSION" >"$work/fetch/Cargo.toml"
        touch "$work/fetch/lib.rs"
        (cd "$work/fetch" && cargo fetch --quiet)
        crate=$(find "$cache" -maxdepth 2 -name "$NAME-$VERSION.crate" | head -n 1)
    fi
    echo "$SHA256  $crate" | sha256sum --check --quiet ||
        { echo "reapply.sh: $crate is not the $NAME $VERSION pinned here (SHA-256)" >&2; exit 1; }
    tar -xzf "$crate" -C "$work"
    mv "$work/$NAME-$VERSION" "$work/upstream"
    (cd "$work/upstream" && rm -rf "${NOT_VENDORED[@]}")
}

# $work/patched: upstream with every patch applied, in order.
patched() {
    cp -r "$work/upstream" "$work/patched"
    local patch
    for patch in "$here"/patches/*.patch; do
        (cd "$work/patched" && git apply --whitespace=nowarn "$patch") ||
            { echo "reapply.sh: $(basename "$patch") does not apply to $NAME $VERSION" >&2; exit 1; }
    done
}

# Every package of vendor/$NAME/Cargo.lock is in upstream's, same version, source and checksum
# (none added, none changed), so the crate's tests build with what upstream tested with.
lock_is_upstreams() {
    local packages='BEGIN { RS = ""; FS = "\n" } /^\[\[package\]\]/ {
        line = ""
        for (i = 1; i <= NF; i++) if ($i ~ /^(name|version|source|checksum) = /) line = line $i " "
        print line }'
    awk "$packages" "$work/upstream/Cargo.lock" | sort >"$work/upstream.lock"
    awk "$packages" "$here/Cargo.lock" | sort >"$work/vendored.lock"
    if [ -n "$(comm -23 "$work/vendored.lock" "$work/upstream.lock")" ]; then
        comm -23 "$work/vendored.lock" "$work/upstream.lock" >&2
        echo "reapply.sh: vendor/$NAME/Cargo.lock has packages (above) that $NAME $VERSION's has not" >&2
        exit 1
    fi
}

excludes() {
    local name
    for name in "${OURS[@]}"; do printf -- '--exclude=%s\n' "$name"; done
}

case "${1:-check}" in
check)
    upstream
    patched
    mapfile -t ex < <(excludes)
    if ! diff -r "${ex[@]}" "$work/patched" "$here" >"$work/differences"; then
        cat "$work/differences" >&2
        echo "reapply.sh: vendor/$NAME is not $NAME $VERSION with patches/ applied (above: what differs;" \
            "\`vendor/$NAME/reapply.sh diff\` writes the patches from the tree)" >&2
        exit 1
    fi
    lock_is_upstreams
    echo "vendor/$NAME is $NAME $VERSION (sha256 $SHA256) with $(ls "$here"/patches/*.patch | wc -l) patches applied"
    ;;
apply)
    upstream
    patched
    # Everything upstream-derived is replaced; capataz's own files stay.
    for name in "$here"/* "$here"/.[!.]*; do
        [ -e "$name" ] || continue
        case " ${OURS[*]} " in *" $(basename "$name") "*) continue ;; esac
        rm -rf "$name"
    done
    cp -r "$work/patched/." "$here/"
    # Upstream's lock, less the packages only the dropped dev-dependencies needed.
    cargo metadata --quiet --format-version 1 --manifest-path "$here/Cargo.toml" >/dev/null
    "$0" check
    ;;
diff)
    upstream
    # Each patch is diffed against upstream with the patches before it applied ($work/stage). A
    # file that a later patch names too keeps this patch's text for it (the tree holds both
    # changes and cannot tell them apart): only the last patch naming a file is rewritten.
    cp -r "$work/upstream" "$work/stage"
    patches=("$here"/patches/*.patch)
    for i in "${!patches[@]}"; do
        patch=${patches[$i]}
        # The description: everything before the first file's header.
        sed -n '/^diff \|^--- /q;p' "$patch" >"$work/new.patch"
        for file in $(sed -n 's|^+++ b/||p' "$patch"); do
            later=no
            for next in "${patches[@]:$((i + 1))}"; do
                if grep -qxF "+++ b/$file" "$next"; then later=yes; fi
            done
            if [ "$later" = yes ]; then
                awk -v f="a/$file" '/^diff -uN / {on = ($3 == f)} on' "$patch" >>"$work/new.patch"
                continue
            fi
            old="a/$file"
            [ -e "$work/stage/$file" ] || old=/dev/null
            echo "diff -uN a/$file b/$file" >>"$work/new.patch"
            diff -uN --label "$old" --label "b/$file" "$work/stage/$file" "$here/$file" \
                >>"$work/new.patch" || [ $? -eq 1 ]
        done
        cp "$work/new.patch" "$patch"
        (cd "$work/stage" && git apply --whitespace=nowarn "$patch") ||
            { echo "reapply.sh: $(basename "$patch") does not apply after the ones before it" >&2; exit 1; }
    done
    "$0" check
    ;;
*)
    echo "usage: vendor/$NAME/reapply.sh [check|apply|diff]" >&2
    exit 2
    ;;
esac
