"""The peer engines of the side-by-side benchmarks, fetched and built from their PyPI source packages into a
cache directory outside the repository (default ~/.cache/kestrel-peers, or $KESTREL_PEERS_DIR).

    llama.cpp     the llama.cpp tree vendored in llama-cpp-python's source package (its Python bindings run
                  from the unpacked package against the library built here)
    ik_llama.cpp  the ik_llama.cpp tree vendored in ik-llama-cpp-python's source package

Each is built once with CMake (Release, -march=native, shared libraries; llama.cpp on an AMX CPU with GCC < 13 without
its AMX code, which that compiler miscompiles: cmake_flags) for the targets the benchmarks run:
libllama, llama-bench, llama-server, llama-quantize. A finished build leaves a stamp naming the source package's
SHA-256; a build that stopped half way is redone. The Python side (llama.cpp's converter needs torch and
transformers; the bindings need jinja2 and diskcache) lives in a virtual environment in the same directory,
made from bench/requirements-peers.txt.

    python bench/peers.py [--peers-dir DIR] [--jobs N] [llama.cpp] [ik_llama.cpp]   # fetch + build, print paths
"""
import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
REQUIREMENTS = os.path.join(HERE, "requirements-peers.txt")

# name -> (PyPI package, version, the engine's tree inside the source package)
PEERS = {
    "llama.cpp": ("llama-cpp-python", "0.3.36", "vendor/llama.cpp"),
    "ik_llama.cpp": ("ik-llama-cpp-python", "0.1.5", "vendor/ik_llama.cpp"),
}
TARGETS = ["llama", "llama-bench", "llama-server", "llama-quantize"]
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF",
               "-DLLAMA_BUILD_TESTS=OFF"]


# ggml's x86 ISA options and the /proc/cpuinfo flags that stand for them (used where -march=native must not be).
GGML_ISA_FLAGS = [("GGML_SSE42", "sse4_2"), ("GGML_F16C", "f16c"), ("GGML_FMA", "fma"), ("GGML_BMI2", "bmi2"),
                  ("GGML_AVX", "avx"), ("GGML_AVX2", "avx2"), ("GGML_AVX_VNNI", "avx_vnni"), ("GGML_AVX512", "avx512bw"),
                  ("GGML_AVX512_VBMI", "avx512vbmi"), ("GGML_AVX512_VNNI", "avx512_vnni"),
                  ("GGML_AVX512_BF16", "avx512_bf16")]


def cpu_flags():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def gcc_major():
    """The major version of the C++ compiler CMake will pick (c++), if it is GCC; else None."""
    try:
        out = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout
        if "clang" in out.lower():
            return None
        return int(subprocess.run(["c++", "-dumpversion"], capture_output=True, text=True).stdout.split(".")[0])
    except (OSError, ValueError):
        return None


def cmake_flags(name):
    """CMAKE_FLAGS, except for llama.cpp on an AMX CPU with GCC < 13: its AMX matmul (ggml-cpu/amx/mmq.cpp) loads
    its tile configuration through GCC 12's `_tile_loadconfig`, whose asm declares an 8-byte read, so the compiler
    drops the stores that fill the 64-byte config and `ldtilecfg` faults (docs/model-math.md §9.1). There the
    build names the host's ISA options one by one instead of -march=native, without AMX."""
    flags = list(CMAKE_FLAGS)
    host = cpu_flags()
    major = gcc_major()
    if name == "llama.cpp" and "amx_int8" in host and major is not None and major < 13:
        flags.remove("-DGGML_NATIVE=ON")
        flags += ["-DGGML_NATIVE=OFF"] + [f"-D{opt}={'ON' if cpu in host else 'OFF'}" for opt, cpu in GGML_ISA_FLAGS]
        flags += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return flags


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("+ " + " ".join(shlex.quote(str(c)) for c in cmd))
    return subprocess.run(cmd, check=True, **kw)


def default_dir():
    return os.environ.get("KESTREL_PEERS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kestrel-peers")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 24), b""):
            h.update(b)
    return h.hexdigest()


def venv_python(peers_dir):
    """The peers' virtual environment (made on first use), as a path to its python."""
    venv = os.path.join(peers_dir, "venv")
    py = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, "requirements.sha256")
    want = sha256(REQUIREMENTS)
    if os.path.exists(py) and os.path.exists(stamp) and open(stamp).read() == want:
        return py
    if not os.path.exists(py):
        run([sys.executable, "-m", "venv", venv])
    run([py, "-m", "pip", "install", "-q", "-r", REQUIREMENTS])
    with open(stamp, "w") as f:
        f.write(want)
    return py


def _fetch(peers_dir, package, version):
    """The unpacked source package (pip download --no-binary: the registry's sdist, nothing prebuilt)."""
    dl = os.path.join(peers_dir, "sdist")
    os.makedirs(dl, exist_ok=True)
    stem = f"{package.replace('-', '_')}-{version}"
    tarball = os.path.join(dl, stem + ".tar.gz")
    if not os.path.exists(tarball):
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", dl,
             f"{package}=={version}"])
    root = os.path.join(peers_dir, stem)
    if not os.path.isdir(root):
        tmp = root + ".part"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        with tarfile.open(tarball) as t:
            if hasattr(tarfile, "data_filter"):
                t.extractall(tmp, filter="data")
            else:
                t.extractall(tmp)
        os.replace(os.path.join(tmp, stem), root)
        shutil.rmtree(tmp)
    return root, sha256(tarball)


def _write_build_info(src, package, version):
    """common/build-info.cpp, which the engine's CMake generates from git (ik-llama-cpp-python 0.1.5's package lacks
    the script that does it, common/cmake/build-info-gen-cpp.cmake, and a package has no git anyway): written once
    from its template, naming the package as the commit."""
    out = os.path.join(src, "common", "build-info.cpp")
    template = out + ".in"
    if os.path.exists(out) or not os.path.exists(template):
        return
    text = open(template).read()
    for key, value in (("@BUILD_NUMBER@", "0"), ("@BUILD_COMMIT@", f"{package}-{version}"),
                       ("@BUILD_COMPILER@", "cc"), ("@BUILD_TARGET@", "native")):
        text = text.replace(key, value)
    with open(out, "w") as f:
        f.write(text)


def ensure(name, peers_dir=None, jobs=2):
    """Fetch and build one peer; returns its paths: root (the unpacked package), src (the engine's tree, with
    the converter and gguf-py for llama.cpp), bin (binaries and shared libraries)."""
    package, version, vendor = PEERS[name]
    peers_dir = peers_dir or default_dir()
    os.makedirs(peers_dir, exist_ok=True)
    root, digest = _fetch(peers_dir, package, version)
    src = os.path.join(root, vendor)
    build = os.path.join(root, "build")
    bin_dir = os.path.join(build, "bin")
    stamp = os.path.join(build, "kestrel-peer.json")
    flags = cmake_flags(name)
    want = {"package": package, "version": version, "sdist_sha256": digest, "cmake": flags, "targets": TARGETS}
    if not (os.path.exists(stamp) and json.load(open(stamp)) == want):
        if os.path.exists(stamp):
            os.remove(stamp)
        _write_build_info(src, package, version)
        run(["cmake", "-S", src, "-B", build, *flags], stdout=subprocess.DEVNULL)
        run(["cmake", "--build", build, "-j", str(jobs), "--target", *TARGETS], stdout=subprocess.DEVNULL)
        with open(stamp, "w") as f:
            json.dump(want, f)
    return {"name": name, "package": package, "version": version, "sdist_sha256": digest, "root": root, "src": src,
            "bin": bin_dir}


def import_llama_cpp(peer):
    """llama-cpp-python's bindings from the unpacked package, bound to the library built by ensure()."""
    os.environ["LLAMA_CPP_LIB_PATH"] = peer["bin"]
    sys.path.insert(0, peer["root"])
    import llama_cpp
    return llama_cpp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("peers", nargs="*", default=list(PEERS), choices=list(PEERS))
    ap.add_argument("--peers-dir", default=default_dir())
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    out = {"venv_python": venv_python(args.peers_dir)}
    for name in args.peers:
        out[name] = ensure(name, args.peers_dir, args.jobs)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
