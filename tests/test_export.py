"""mxq/runtime/export.py's name rule: an exported function is the symbol ``__tvm_ffi_<name>``, so names
that TVM-FFI's loader gives a meaning to are refused before anything compiles."""

import re
from pathlib import Path

import pytest

import mxq
from mxq.runtime.export import check_name


def _loader_symbols() -> list[str]:
    """The special symbols TVM-FFI's own header declares (tvm/ffi/extra/module.h and the cubin
    macros), read from the installed package: an independent list, not mxq's."""
    import tvm_ffi

    inc = Path(tvm_ffi.__file__).resolve().parent / "include" / "tvm" / "ffi"
    text = "".join(p.read_text() for p in inc.rglob("*.h"))
    return sorted(set(re.findall(r'"(__tvm_ffi_\w+)"', text)) | set(re.findall(r"\b(__tvm_ffi__[a-z]+_)", text)))


def test_every_symbol_the_loader_reserves_is_refused_as_a_name():
    symbols = _loader_symbols()
    assert "__tvm_ffi__library_ctx" in symbols and "__tvm_ffi__library_bin" in symbols, symbols
    for sym in symbols:
        name = sym[len("__tvm_ffi_"):]
        with pytest.raises(ValueError, match="is reserved"):
            check_name(name)
        if name.startswith("_"):  # (the prefixes: _metadata_<name>, _doc_<name>, _cubin_<name>)
            with pytest.raises(ValueError, match="is reserved"):
                check_name(name + "x")


@pytest.mark.parametrize("name, error, words", [
    ("_library_ctx", ValueError, "is reserved"),
    ("_library_bin", ValueError, "is reserved"),
    ("main", ValueError, "is reserved"),
    ("", ValueError, "must be a C identifier, got ''"),
    ("bad-name", ValueError, "must be a C identifier"),
    (123, TypeError, "argument 'name' must be a str or None, got int"),
    ("n" * 201, ValueError, "must be at most 200 characters"),
])
def test_export_refuses_a_bad_name_before_compiling(tmp_path, name, error, words):
    with pytest.raises(error, match=re.escape(words)):
        _identity.export(tmp_path, name=name)
    assert not any(tmp_path.iterdir())


def _ident(x):
    return x


_identity = mxq.fused_quant(colwise=True)(_ident)


def test_ordinary_names_pass():
    for name in ("my_op", "mxq_gelu", "Op2", "mainline"):
        assert check_name(name) == name


def test_export_refuses_a_directory_that_is_not_a_path():
    with pytest.raises(TypeError, match="argument 'directory' must be a path"):
        _identity.export(None)


def test_export_refuses_a_name_that_differs_from_an_export_beside_it_only_in_case(tmp_path, monkeypatch):
    """The header's include guard and its functions' _NAME macros upper-case the name: an export
    of "myquant" into a directory holding the export "MyQuant" (its header and library) is
    refused before anything compiles; a lone header of that name (not an export) is not in the way."""
    (tmp_path / "MyQuant.h").write_text("#ifndef MYQUANT_H_\n#define MYQUANT_H_\n#endif\n")
    (tmp_path / "libMyQuant.so").write_bytes(b"")
    with pytest.raises(ValueError, match="'myquant' differs from the export 'MyQuant' .* only in case"):
        _identity.export(tmp_path, name="myquant")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MyQuant.h", "libMyQuant.so"]
    (tmp_path / "libMyQuant.so").unlink()
    from mxq.runtime import export

    def stop(*args, **kwargs):  # (past the name checks: stopped at compiling)
        raise RuntimeError("compiling")

    monkeypatch.setattr(export, "compile_op", stop)
    with pytest.raises(RuntimeError, match="compiling"):
        _identity.export(tmp_path, name="myquant")
    # (a directory the failed export made is removed again; one that was there stays)
    with pytest.raises(RuntimeError, match="compiling"):
        _identity.export(tmp_path / "new", name="myquant")
    assert not (tmp_path / "new").exists() and (tmp_path / "MyQuant.h").exists()


@pytest.mark.parametrize("note, error, words", [
    ("hello */ #error injected\n/* ", ValueError, "a C comment delimiter"),
    ("see /* here", ValueError, "a C comment delimiter"),
    ("bell \a", ValueError, "the character '\\x07'"),
    (b"bytes", TypeError, "argument 'note' must be a str, got bytes"),
])
def test_export_refuses_a_note_that_would_leave_the_headers_comment(tmp_path, note, error, words):
    """export(note=...) is a paragraph of the header's comment block: text that would end the
    comment (and compile the rest: '#error injected' failed every program including the header)
    or is not printable is refused before anything compiles; ordinary text passes."""
    from mxq.runtime.export import check_note

    with pytest.raises(error, match=re.escape(words)):
        _identity.export(tmp_path, note=note)
    assert not any(tmp_path.iterdir())
    check_note("x[:, :N] is the gate half;\n\tthe up half is x[:, N:] (2 * N columns / 2).")


def test_export_into_a_file_is_refused_by_name(tmp_path):
    """A directory argument naming an existing file: a ValueError naming it (it was the raw
    FileExistsError of mkdir), before anything compiles."""
    blocker = tmp_path / "afile"
    blocker.write_text("")
    with pytest.raises(ValueError, match="argument 'directory' is .*afile.*, which is a file"):
        _identity.export(blocker)
    with pytest.raises(ValueError, match="argument 'directory' is .*afile/sub.*, which cannot be made"):
        _identity.export(blocker / "sub")  # (a file on its path: mkdir's raw NotADirectoryError)
    assert check_name("n" * 200) == "n" * 200


def test_a_function_name_that_is_no_c_identifier_is_named_as_the_default_names_source(tmp_path):
    """An op exported without a name takes mxq_<function name>; a Python identifier C does not
    take (non-ASCII letters) is refused naming the function, not a name the caller never gave."""
    import importlib.util

    mod = tmp_path / "mxq_unicode_op.py"
    mod.write_text("import mxq\n\n\n@mxq.fused_quant\ndef f\u00fcnf(x):\n    return x * 2.0\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("mxq_unicode_op", mod)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    op = getattr(m, "f\u00fcnf")
    with pytest.raises(ValueError, match="the epilogue function 'f\u00fcnf' gives the default export name 'mxq_f\u00fcnf'"):
        op.export(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_export_refuses_destinations_that_are_not_files_before_compiling(tmp_path, monkeypatch):
    """A runtime library's copy, the library or the header whose path is a directory, or a
    symbolic link the export would write through (dangling or not), is refused by name before
    anything compiles; a link to the runtime library itself is left as it is."""
    from mxq.runtime import export, toolchain

    def stop(*args, **kwargs):  # (past the checks: stopped before compiling)
        raise RuntimeError("compiling")

    monkeypatch.setattr(export, "compile_op", stop)
    runtime = [Path(p).name for p in toolchain.runtime_libraries()]
    assert "libtvm_ffi.so" in runtime
    for what in ("libtvm_ffi.so", "libq.so", "q.h"):
        d = tmp_path / f"dir_{what}"
        (d / what).mkdir(parents=True)
        with pytest.raises(ValueError, match=f"writes the file '.*{re.escape(what)}', which exists and is not a file"):
            _identity.export(d, name="q")
        e = tmp_path / f"link_{what}"
        e.mkdir()
        (e / what).symlink_to(tmp_path / "elsewhere")
        with pytest.raises(ValueError, match=f"write through the symbolic link '.*{re.escape(what)}'"):
            _identity.export(e, name="q")
        assert not (tmp_path / "elsewhere").exists()
    ok = tmp_path / "same"
    ok.mkdir()
    src = next(p for p in toolchain.runtime_libraries() if Path(p).name == "libtvm_ffi.so")
    (ok / "libtvm_ffi.so").symlink_to(src)
    with pytest.raises(RuntimeError, match="compiling"):
        _identity.export(ok, name="q")


def test_export_refuses_a_name_whose_macros_another_export_beside_it_defines(tmp_path, monkeypatch):
    """Exports "MyOp" then "myop_vec" in one directory: the first's function "MyOp_vec" and the
    second's "myop_vec" both define MYOP_VEC_NAME; the second is refused before compiling, naming
    both; a name whose macros are its own passes."""
    from mxq.runtime import export

    (tmp_path / "MyOp.h").write_text('#ifndef MYOP_H_\n#define MYOP_H_\n#define MYOP_NAME "MyOp"\n'
                                     '#define MYOP_VEC_NAME "MyOp_vec"\n#endif\n')
    (tmp_path / "libMyOp.so").write_bytes(b"")

    def stop(*args, **kwargs):
        raise RuntimeError("compiling")

    monkeypatch.setattr(export, "compile_op", stop)
    with pytest.raises(ValueError, match="function 'myop_vec' and the export 'MyOp''s 'MyOp_vec' .* MYOP_VEC_NAME"):
        _identity.export(tmp_path, name="myop_vec")
    with pytest.raises(RuntimeError, match="compiling"):
        _identity.export(tmp_path, name="other")


def test_export_refuses_a_directory_it_cannot_write_into_before_compiling(tmp_path, monkeypatch):
    """An existing directory this process cannot write into (a read-only mount; permissions) is a
    ValueError naming ``directory`` before anything compiles, not the linker's words after every
    kernel has compiled."""
    from mxq.runtime import export

    def stop(*args, **kwargs):
        raise RuntimeError("compiling")

    monkeypatch.setattr(export, "compile_op", stop)
    ro = tmp_path / "ro"
    ro.mkdir()
    real = export.os.access
    monkeypatch.setattr(export.os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    with pytest.raises(ValueError, match="argument 'directory' is .*ro.*, which this process cannot write into"):
        _identity.export(ro, name="q")
    with pytest.raises(RuntimeError, match="compiling"):
        _identity.export(tmp_path / "rw", name="q")


def test_runtime_copies_are_kept_when_equal_and_replaced_whole_when_not(tmp_path):
    """export's copy of a runtime library: left untouched (same inode, same times) where it holds
    the same bytes; else a new file renamed over it, so a program that has the old copy mapped
    keeps its bytes (a copy written over the same file changes the pages under it: SIGBUS)."""
    from mxq.runtime.export import _copy_runtime

    src = tmp_path / "libx.so"
    src.write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    out = tmp_path / "out"
    out.mkdir()
    dst = _copy_runtime(src, out / "libx.so")
    assert dst.read_bytes() == src.read_bytes()
    before = dst.stat()
    assert _copy_runtime(src, dst) == dst
    after = dst.stat()
    assert [getattr(after, k) for k in ("st_ino", "st_mtime_ns", "st_ctime_ns")] == [
        getattr(before, k) for k in ("st_ino", "st_mtime_ns", "st_ctime_ns")]
    with open(dst, "rb") as held:  # (a loaded program's view of the old file)
        src.write_bytes(b"\x7fELF" + b"new" * 100)
        _copy_runtime(src, dst)
        assert dst.stat().st_ino != before.st_ino and dst.read_bytes() == src.read_bytes()
        assert held.read(8) == b"\x7fELF" + bytes(range(4))
    assert sorted(p.name for p in out.iterdir()) == ["libx.so"]  # (no temporary left)


def test_cxx_is_a_command_line_and_a_bad_one_names_cxx(tmp_path, monkeypatch):
    """``CXX`` is split like a shell line (``ccache g++``, ``g++ -O0`` as in make); a program that
    does not exist, or a line that does not parse, is a ToolchainError naming CXX."""
    import shutil

    from mxq.runtime import toolchain

    gxx = shutil.which("g++") or shutil.which("c++")
    src = tmp_path / "a.cc"
    src.write_text("int answer() { return 42; }\n")
    monkeypatch.setenv("CXX", f"{gxx} -O0")
    assert toolchain._cxx() == [gxx, "-O0"]
    toolchain.compile_cxx(src, tmp_path / "a.o", [])
    assert (tmp_path / "a.o").stat().st_size > 0
    for bad, words in (("no-such-compiler g++", "names 'no-such-compiler', which is not an executable"),
                       ("'g++", "is not a command line")):
        monkeypatch.setenv("CXX", bad)
        with pytest.raises(toolchain.ToolchainError, match=f"environment variable CXX=.*{words}"):
            toolchain.compile_cxx(src, tmp_path / "b.o", [])
    monkeypatch.setenv("CXX", " ")
    assert toolchain._cxx() == [gxx]


def test_a_failed_export_removes_only_its_own_files_from_the_directory_it_made(tmp_path, monkeypatch):
    """A failed export into a directory it made removes its files, and the directory with the
    runtime copies where nothing else is there; another export's files written into the same new
    directory meanwhile (two processes exporting at once), and the runtime copies they load, stay."""
    from mxq.runtime import export, toolchain

    runtime = [Path(p).name for p in toolchain.runtime_libraries()]
    new = tmp_path / "new"

    def fails_after_others_wrote(op, out, name, *args):
        for f in [f"lib{name}.so", f"{name}.h", *runtime]:  # (this export's own files, as _write leaves them)
            (out / f).write_bytes(b"")
        if name == "b":
            (out / "liba.so").write_bytes(b"a")  # (the other export's)
            (out / "a.h").write_text("a")
        raise RuntimeError("linking")

    monkeypatch.setattr(export, "_write", fails_after_others_wrote)
    with pytest.raises(RuntimeError, match="linking"):
        _identity.export(new, name="b")
    assert sorted(p.name for p in new.iterdir()) == sorted(["liba.so", "a.h", *runtime])
    with pytest.raises(RuntimeError, match="linking"):
        _identity.export(tmp_path / "alone", name="c")
    assert not (tmp_path / "alone").exists()
