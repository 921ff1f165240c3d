"""Count the documented public API of runtime-core from rustdoc's JSON output.

    RUSTDOCFLAGS="-Zunstable-options --output-format json" \
        cargo +nightly doc --no-deps -p runtime-core
    python3 scripts/count_public_api.py target/doc/runtime_core.json [--list]

Walks the crate from its root module through public modules and re-exports (rustdoc leaves
`#[doc(hidden)]` items and items of features not enabled out of the JSON) and counts each
reachable item once: modules, structs, enums, unions, traits, functions, constants, statics,
type aliases and macros; methods and associated constants/types of inherent impls; trait
methods; enum variants; public struct fields. Trait impls (`impl Display for ..`) are not
counted. `--list` prints every counted path.
"""

import json
import sys


def main() -> None:
    doc = json.load(open(sys.argv[1]))
    index = doc["index"]
    seen: set[str] = set()
    paths: list[tuple[str, str]] = []

    def count(kind: str, path: str) -> None:
        paths.append((kind, path))

    def walk(item_id, path: str) -> None:
        key = str(item_id)
        if key in seen or key not in index:
            return
        seen.add(key)
        item = index[key]
        if item.get("visibility") not in ("public", "default", None) and path:
            return
        ((kind, inner),) = item["inner"].items()
        name = item.get("name") or ""
        here = f"{path}::{name}" if path else name
        if kind == "module":
            count(kind, here)
            for child in inner["items"]:
                walk(child, here)
        elif kind == "use":
            if inner.get("id") is not None:
                target = index.get(str(inner["id"]))
                if target is not None:
                    walk(inner["id"], path)
        elif kind in ("struct", "enum", "union"):
            count(kind, here)
            if kind == "enum":
                for v in inner["variants"]:
                    count("variant", f"{here}::{index[str(v)]['name']}")
            if kind == "struct":
                fields = (
                    inner["kind"].get("plain", {}).get("fields", [])
                    if isinstance(inner["kind"], dict)
                    else []
                )
                for f in fields:
                    fi = index.get(str(f))
                    if fi and fi.get("visibility") == "public":
                        count("field", f"{here}.{fi['name']}")
            for impl_id in inner.get("impls", []):
                impl = index[str(impl_id)]["inner"]["impl"]
                if (
                    impl.get("trait") is not None
                    or impl.get("is_synthetic")
                    or impl.get("blanket_impl")
                ):
                    continue
                for m in impl["items"]:
                    mi = index.get(str(m))
                    if mi and mi.get("visibility") == "public":
                        count(next(iter(mi["inner"])), f"{here}::{mi['name']}")
        elif kind == "trait":
            count(kind, here)
            for m in inner["items"]:
                mi = index.get(str(m))
                if mi:
                    count("trait " + next(iter(mi["inner"])), f"{here}::{mi['name']}")
        elif kind in ("function", "constant", "static", "type_alias", "macro"):
            count(kind, here)

    walk(doc["root"], "")
    by_kind: dict[str, int] = {}
    for kind, _ in paths:
        by_kind[kind] = by_kind.get(kind, 0) + 1
    if "--list" in sys.argv:
        for kind, p in sorted(paths, key=lambda x: x[1]):
            print(f"{kind:16} {p}")
    items = sum(n for k, n in by_kind.items() if k not in ("variant", "field"))
    print(
        f"total {len(paths)}  (items {items}, enum variants {by_kind.get('variant', 0)}, "
        f"struct fields {by_kind.get('field', 0)})"
    )
    print("  " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())))


if __name__ == "__main__":
    main()
