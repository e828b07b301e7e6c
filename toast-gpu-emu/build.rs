//! Compiles the shared device source (`toast-accel/device/kernels.h`) for the
//! host, behind `prelude_host.h`, and generates one launcher per kernel.
//!
//! The kernel list is never written by hand: the source is run through the C
//! preprocessor with `KERNEL` expanding to a marker, and every
//! `<marker> void NAME(PARAMS)` in the output is a kernel (including the ones
//! a macro such as `TOAST_SCAN_MAP` generates). For each, the build emits
//!
//! - a C function `toast_emu_run_NAME(params, grid, block, b0, b1)` that
//!   copies each argument out of the `void **kernelParams` array (by the
//!   parameter's declared C type), then runs the kernel for every thread of
//!   blocks `b0..b1` (linear block index, x fastest) with the thread-local
//!   grid indices set;
//! - a row of the Rust table `KERNELS` (`kernel_table.rs` in `OUT_DIR`): the
//!   name, the parameter kinds (for validating pointers before a launch)
//!   and the launcher.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const MARKER: &str = "__toast_host_kernel__";

/// How a kernel parameter is passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pointer,
    I64,
    U64,
    I32,
    U8,
    F64,
    F32,
}

impl Kind {
    fn rust(self) -> &'static str {
        match self {
            Kind::Pointer => "Pointer",
            Kind::I64 => "I64",
            Kind::U64 => "U64",
            Kind::I32 => "I32",
            Kind::U8 => "U8",
            Kind::F64 => "F64",
            Kind::F32 => "F32",
        }
    }
}

#[derive(Debug)]
struct Param {
    /// The C type, `restrict` removed (and top-level `const` for scalars).
    ctype: String,
    kind: Kind,
}

#[derive(Debug)]
struct Kernel {
    name: String,
    params: Vec<Param>,
}

/// Tokens of preprocessed C: identifiers/numbers, and single punctuation
/// characters; line markers (`# 1 "file"`) are skipped.
fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let mut cur = String::new();
        for c in line.chars() {
            if c.is_ascii_alphanumeric() || c == '_' {
                cur.push(c);
                continue;
            }
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
    }
    out
}

fn param(tokens: &[String], kernel: &str) -> Param {
    let (name, ty) = tokens
        .split_last()
        .unwrap_or_else(|| panic!("{kernel}: an empty parameter"));
    assert!(
        name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !ty.is_empty(),
        "{kernel}: cannot read the parameter `{}`",
        tokens.join(" ")
    );
    let ty: Vec<&str> = ty
        .iter()
        .map(String::as_str)
        .filter(|t| *t != "restrict" && *t != "__restrict" && *t != "__restrict__")
        .collect();
    if ty.contains(&"*") {
        return Param {
            ctype: ty.join(" "),
            kind: Kind::Pointer,
        };
    }
    let base: Vec<&str> = ty
        .iter()
        .copied()
        .filter(|t| *t != "const" && *t != "volatile")
        .collect();
    let kind = match base.as_slice() {
        ["i64"] | ["int64_t"] | ["long", "long"] => Kind::I64,
        ["u64"] | ["uint64_t"] => Kind::U64,
        ["i32"] | ["int32_t"] | ["int"] => Kind::I32,
        ["u8"] | ["uint8_t"] => Kind::U8,
        ["double"] => Kind::F64,
        ["float"] => Kind::F32,
        other => panic!(
            "{kernel}: parameter `{name}` has a type the emulator cannot pass: `{}`",
            other.join(" ")
        ),
    };
    Param {
        ctype: base.join(" "),
        kind,
    }
}

/// Every `MARKER void NAME ( ... )` in the preprocessed source.
fn kernels(preprocessed: &str) -> Vec<Kernel> {
    let t = tokens(preprocessed);
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if t[i] != MARKER {
            i += 1;
            continue;
        }
        assert!(
            t.get(i + 1).map(String::as_str) == Some("void")
                && t.get(i + 3).map(String::as_str) == Some("("),
            "a KERNEL not followed by `void NAME(`: {:?}",
            &t[i..(i + 4).min(t.len())]
        );
        let name = t[i + 2].clone();
        let mut depth = 1;
        let mut j = i + 4;
        let mut params = Vec::new();
        let mut cur: Vec<String> = Vec::new();
        while depth > 0 {
            let tok = t
                .get(j)
                .unwrap_or_else(|| panic!("{name}: unterminated parameter list"));
            match tok.as_str() {
                "(" => {
                    depth += 1;
                    cur.push(tok.clone());
                }
                ")" => {
                    depth -= 1;
                    if depth > 0 {
                        cur.push(tok.clone());
                    }
                }
                "," if depth == 1 => params.push(std::mem::take(&mut cur)),
                _ => cur.push(tok.clone()),
            }
            j += 1;
        }
        if !(cur.is_empty() || (cur.len() == 1 && cur[0] == "void")) {
            params.push(cur);
        }
        let params = params.iter().map(|p| param(p, &name)).collect();
        out.push(Kernel { name, params });
        i = j;
    }
    out
}

fn c_launchers(kernels: &[Kernel]) -> String {
    let mut c = String::from(
        "/* Generated by toast-gpu-emu's build script: do not edit. */\n\
         #include \"prelude_host.h\"\n\
         #include \"kernels.h\"\n\n\
         _Thread_local i64 toast_host_gid[3];\n",
    );
    for k in kernels {
        let _ = writeln!(
            c,
            "\nvoid toast_emu_run_{n}(void *const *p, const uint32_t *grid, const uint32_t *block,\n\
             \x20   uint64_t b0, uint64_t b1) {{",
            n = k.name
        );
        for (i, p) in k.params.iter().enumerate() {
            let _ = writeln!(
                c,
                "    {t} a{i};\n    __builtin_memcpy(&a{i}, p[{i}], sizeof a{i});",
                t = p.ctype
            );
        }
        let args: Vec<String> = (0..k.params.len()).map(|i| format!("a{i}")).collect();
        let _ = write!(
            c,
            "    for (uint64_t b = b0; b < b1; b++) {{\n\
             \x20       const uint64_t bx = b % grid[0];\n\
             \x20       const uint64_t by = (b / grid[0]) % grid[1];\n\
             \x20       const uint64_t bz = b / grid[0] / grid[1];\n\
             \x20       for (uint32_t tz = 0; tz < block[2]; tz++) {{\n\
             \x20           for (uint32_t ty = 0; ty < block[1]; ty++) {{\n\
             \x20               for (uint32_t tx = 0; tx < block[0]; tx++) {{\n\
             \x20                   toast_host_gid[0] = (i64)(bx * block[0] + tx);\n\
             \x20                   toast_host_gid[1] = (i64)(by * block[1] + ty);\n\
             \x20                   toast_host_gid[2] = (i64)(bz * block[2] + tz);\n\
             \x20                   {n}({args});\n\
             \x20               }}\n\
             \x20           }}\n\
             \x20       }}\n\
             \x20   }}\n\
             }}\n",
            n = k.name,
            args = args.join(", ")
        );
    }
    c
}

fn rust_table(kernels: &[Kernel]) -> String {
    let mut r = String::from(
        "// Generated by toast-gpu-emu's build script: do not edit.\n\nextern \"C\" {\n",
    );
    for k in kernels {
        let _ = writeln!(
            r,
            "    fn toast_emu_run_{}(p: *const *mut c_void, grid: *const u32, block: *const u32, b0: u64, b1: u64);",
            k.name
        );
    }
    r.push_str("}\n\n/// Every kernel of `kernels.h`, in source order.\n");
    let _ = writeln!(
        r,
        "pub(crate) static KERNELS: [Kernel; {}] = [",
        kernels.len()
    );
    for k in kernels {
        let kinds: Vec<String> = k
            .params
            .iter()
            .map(|p| format!("ParamKind::{}", p.kind.rust()))
            .collect();
        let _ = writeln!(
            r,
            "    Kernel {{ name: \"{n}\", params: &[{kinds}], run: toast_emu_run_{n} }},",
            n = k.name,
            kinds = kinds.join(", ")
        );
    }
    r.push_str("];\n");
    r
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let device = manifest.join("../toast-accel/device");
    for f in ["kernels.h", "prelude_host.h"] {
        println!("cargo:rerun-if-changed={}", device.join(f).display());
    }
    println!("cargo:rerun-if-changed=build.rs");

    // 1. The kernels' signatures, from the preprocessed source.
    let scan = out.join("toast_emu_scan.c");
    std::fs::write(
        &scan,
        "#include \"prelude_host.h\"\n#include \"kernels.h\"\n",
    )
    .expect("write the scan source");
    let expanded = base(&device)
        .define("TOAST_HOST_KERNEL", MARKER)
        .file(&scan)
        .expand();
    let kernels = kernels(&String::from_utf8_lossy(&expanded));
    assert!(
        !kernels.is_empty(),
        "no KERNEL found in {}",
        device.join("kernels.h").display()
    );

    // 2. The kernels and their launchers, compiled for the host.
    let launchers = out.join("toast_emu_kernels.c");
    std::fs::write(&launchers, c_launchers(&kernels)).expect("write the launchers");
    std::fs::write(out.join("kernel_table.rs"), rust_table(&kernels)).expect("write the table");
    base(&device).file(&launchers).compile("toast_emu_kernels");
    println!("cargo:rustc-link-lib=m");
}

/// The compiler settings of both passes: C11, no FP contraction (results
/// round as the CPU reference's), no fast-math.
fn base(device: &Path) -> cc::Build {
    let mut b = cc::Build::new();
    b.include(device)
        .std("c11")
        .flag("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .warnings(true)
        .extra_warnings(true);
    b
}
