#!/usr/bin/env python3
"""Builds and runs every C++ block of the user documentation against an installed remat.

Every block fenced as ```cpp in README.md and docs/*.md is a complete program. This script
writes each one to its own file, generates a CMake project that finds remat with
find_package (the components each block needs, read from its #includes), builds it, and
runs every program in a scratch folder of the build tree (what a program writes lands there).
A block that stops compiling or running fails the ctest that calls this (`ctest -R readme`).

    snippets.py --source ROOT --build DIR --prefix INSTALL_PREFIX [--cmake CMAKE]
                [--generator G] [--cxx COMPILER] [--list]
"""
import argparse
import pathlib
import re
import subprocess
import sys
import time

FENCE = re.compile(r"^```cpp[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

# Component of remat a block needs, by what it includes.
COMPONENTS = [
    ("torch", re.compile(r"#\s*include\s*<(remat/torch/|torch/)")),
    ("json", re.compile(r"#\s*include\s*<remat/(io/json|torch/exported)\.hpp>")),
    ("lpsolve", re.compile(r"#\s*include\s*<remat/(milp/lp_solve|solvers/rockmate_milp)\.hpp>")),
    ("cbc", re.compile(r"#\s*include\s*<remat/milp/cbc\.hpp>")),
]


def documents(root: pathlib.Path):
    yield root / "README.md"
    docs = root / "docs"
    if docs.is_dir():
        yield from sorted(docs.glob("*.md"))


def extract(root: pathlib.Path):
    """(name, document, line, code, components) for every ```cpp block."""
    blocks = []
    for doc in documents(root):
        text = doc.read_text(encoding="utf-8")
        for n, match in enumerate(FENCE.finditer(text), start=1):
            code = match.group(1)
            line = text.count("\n", 0, match.start()) + 2
            stem = re.sub(r"[^a-z0-9]+", "_", doc.stem.lower())
            components = [name for name, pattern in COMPONENTS if pattern.search(code)]
            blocks.append((f"{stem}_{n}", doc.relative_to(root), line, code, components))
    return blocks


def write_project(blocks, build: pathlib.Path) -> None:
    src = build / "src"
    src.mkdir(parents=True, exist_ok=True)
    wanted = sorted({c for *_, components in blocks for c in components})
    lines = [
        "cmake_minimum_required(VERSION 3.20)",
        "project(remat_doc_snippets LANGUAGES CXX)",
        "set(CMAKE_CXX_STANDARD 20)",
        "set(CMAKE_CXX_STANDARD_REQUIRED ON)",
        "find_package(remat REQUIRED)",  # the core, and every layer it can find
        "find_program(REMAT_CCACHE ccache)",
        "if(REMAT_CCACHE)",
        "  set(CMAKE_CXX_COMPILER_LAUNCHER ${REMAT_CCACHE})",
        "endif()",
    ]
    for name, doc, line, code, components in blocks:
        (src / f"{name}.cpp").write_text(f"// {doc}, line {line}\n{code}", encoding="utf-8")
        condition = " AND ".join(f"TARGET remat::{c}" for c in components) or "TRUE"
        libraries = " ".join(["remat::remat"] + [f"remat::{c}" for c in components])
        lines += [
            f"if({condition})",
            f"  add_executable({name} src/{name}.cpp)",
            f"  target_link_libraries({name} PRIVATE {libraries})",
            f"  target_compile_options({name} PRIVATE -Wall -Wextra -Wpedantic)",
            "else()",
            f'  message(STATUS "snippet {name} ({doc}:{line}) skipped: needs {", ".join(components)}")',
            "endif()",
        ]
    if "torch" in wanted:
        # The torch blocks share one precompiled header: each would otherwise parse
        # <torch/torch.h> again (~25 s).
        torch_names = [name for name, *_, components in blocks if "torch" in components]
        lines += [f"if(TARGET {torch_names[0]})",
                  f"  target_precompile_headers({torch_names[0]} PRIVATE <torch/torch.h>)"]
        lines += [f"  target_precompile_headers({n} REUSE_FROM {torch_names[0]})" for n in torch_names[1:]]
        lines += ["endif()"]
    (build / "CMakeLists.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def run(command, **kwargs) -> None:
    print("+", " ".join(str(c) for c in command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, type=pathlib.Path)
    parser.add_argument("--build", required=True, type=pathlib.Path)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--cmake", default="cmake")
    parser.add_argument("--generator", default=None)
    parser.add_argument("--cxx", default=None)
    parser.add_argument("--cmake-arg", action="append", default=[],
                        help="another option of the snippets' configure (repeatable; e.g. LibTorch's CUDA hints)")
    parser.add_argument("--list", action="store_true", help="list the blocks and exit")
    args = parser.parse_args()
    root = args.source.resolve()
    blocks = extract(root)
    if args.list:
        for name, doc, line, _, components in blocks:
            print(f"{name}: {doc}:{line} ({', '.join(components) or 'core'})")
        return 0
    if not blocks:
        print("no ```cpp blocks found in README.md or docs/", file=sys.stderr)
        return 1
    build = args.build.resolve()
    write_project(blocks, build)
    prefixes = args.prefix.replace("|", ";").rstrip(";")  # '|' separates several prefixes
    # Packages are found again each run (a cached Torch_DIR would outlive a change of LibTorch).
    (build / "out" / "CMakeCache.txt").unlink(missing_ok=True)
    # -O1, not Release's -O3: the blocks run in about 15 s in all either way, and -O1 compiles
    # them in 0.7 of the CPU time (347 s against 497 s for the 14 blocks, 213 s against 295 s
    # of wall time on 2 cores, measured without ccache): this test is the longest of the suite.
    configure = [args.cmake, "-S", build, "-B", build / "out", f"-DCMAKE_PREFIX_PATH={prefixes}",
                 "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG"]
    if args.generator:
        configure += ["-G", args.generator]
    if args.cxx:
        configure += [f"-DCMAKE_CXX_COMPILER={args.cxx}"]
    configure += [a for a in args.cmake_arg if a]
    run(configure)
    run([args.cmake, "--build", build / "out", "-j2"])
    failures = []
    scratch = build / "run"
    scratch.mkdir(exist_ok=True)
    for name, doc, line, _, _ in blocks:
        exe = build / "out" / name
        if not exe.exists():
            print(f"skipped {name} ({doc}:{line}): a component it needs is not installed")
            continue
        start = time.monotonic()
        result = subprocess.run([exe], cwd=scratch, capture_output=True, text=True, timeout=600)
        took = time.monotonic() - start
        status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
        print(f"{name} ({doc}:{line}): {status} in {took:.1f} s")
        if result.returncode != 0:
            print(result.stdout[-4000:], result.stderr[-4000:], sep="\n")
            failures.append(f"{doc}:{line}")
    if failures:
        print("blocks that failed: " + ", ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
