"""Rules every WGSL kernel keeps that no GPU here would catch.

A store to one component of a vector in workgroup memory may write the whole vector (WGSL's memory model:
gpuweb#2112; Metal's and D3D's compilers do, and Chrome on macOS and Windows lost writes that way), so
invocations that store components of one shared vector race even though each writes its own component.
Vulkan (lavapipe, SwiftShader, the H200) stores the component alone, so the kernel tests cannot see it:
this scan does. Shared vectors are written whole, by one invocation each. (It follows vectors and arrays of
vectors declared as such, not vectors inside structs or behind aliases: no kernel has those.)
"""

import re

from support.paths import ROOT

ASSIGN = re.compile(r"\s*(=(?!=)|[-+*/%&|^]=|<<=|>>=|\+\+|--)")


def _closing(text: str, i: int) -> int:
    """Index just past the bracket that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        depth += {"[": 1, "]": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    raise ValueError("unbalanced brackets")


def shared_vectors(source: str) -> set[tuple[str, bool]]:
    """(name, whether an array) of each workgroup vector or array of vectors source declares."""
    return {(name, bool(array)) for name, array in re.findall(r"var<workgroup>\s+(\w+)\s*:\s*(array<\s*)?vec", source)}


def component_stores(source: str, declared: set[tuple[str, bool]] | None = None) -> list[str]:
    """Statements of source that assign to a component of a workgroup vector (declared: those of source, or
    of every file where source is an include that another file's declarations reach)."""
    source = re.sub(r"//[^\n]*", "", source)      # comments (their brackets need not balance)
    found = []
    for name, array in sorted(declared if declared is not None else shared_vectors(source)):
        for m in re.finditer(rf"\b{name}\b", source):
            i = m.end()
            if array and source[i:].lstrip().startswith("["):     # an element of an array of vectors
                i = _closing(source, source.index("[", i))
            rest = source[i:].lstrip()
            if rest.startswith("["):                                # a component of a vector
                i = _closing(source, source.index("[", i))
            elif re.match(r"\.\s*[xyzwrgba]\b", rest):
                i = source.index(".", i) + 1
                i = re.compile(r"\s*[xyzwrgba]\b").match(source, i).end()
            else:
                continue
            if ASSIGN.match(source, i):
                line = source.count("\n", 0, m.start()) + 1
                found.append(f"{line}: {source[m.start():source.index(';', m.start())].strip()}")
    return found


def test_no_kernel_passes_workgroup_memory_by_pointer():
    """What the scan above cannot follow: a component store through a pointer (none, so none to follow)."""
    sources = {p.name: p.read_text() for p in sorted((ROOT / "shaders").glob("*.wgsl"))}
    assert {name for name, src in sources.items() if re.search(r"ptr<\s*workgroup", src)} == set()


def test_no_kernel_stores_components_of_a_shared_vector():
    sources = {p.name: p.read_text() for p in sorted((ROOT / "shaders").glob("*.wgsl"))}
    declared = set().union(*map(shared_vectors, sources.values()))     # includes use their includers' arrays
    offenders = {name: component_stores(src, declared) for name, src in sources.items()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_scan_finds_component_stores():
    src = """
    var<workgroup> pt: array<vec4<f32>, 64>;
    var<workgroup> one: vec4<u32>;
    var<workgroup> flat: array<f32, 64>;
    fn f(lid: u32) {
        pt[lid / 4u][lid % 4u] = 1.0;
        pt[g(lid)].y += 2.0;
        pt [lid] [1] ++;
        one[lid] = 3u;
        pt[lid] = vec4<f32>(0.0);
        flat[lid] = 1.0;
        let x = pt[lid][0] == 1.0;
    }
    """
    assert sorted(s.split(": ", 1)[1] for s in component_stores(src)) == [
        "one[lid] = 3u", "pt [lid] [1] ++", "pt[g(lid)].y += 2.0", "pt[lid / 4u][lid % 4u] = 1.0"]
