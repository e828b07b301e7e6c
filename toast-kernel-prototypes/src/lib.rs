//! The kernels of the shared device source (`toast-accel/device/kernels.h`)
//! as the build scripts of the device crates read them: every `KERNEL void
//! NAME(PARAMS)` of the preprocessed source (macro-generated ones
//! included), with each parameter's name, C type and kind.
//!
//! The kernel list and the parameter lists are never written by hand:
//! `toast-gpu-emu` generates its host launchers from them and `toast-gpu`
//! the typed launch parameters its marshalling fills in by name (so a
//! swapped, missing or extra argument is a compile error, not a run-time
//! fault). A build-time crate: it depends on `cc` for the preprocessor.

use std::path::Path;

/// What `KERNEL` expands to while the source is scanned.
pub const MARKER: &str = "__toast_host_kernel__";

/// The kernels of `device/kernels.h` in source order, preprocessed for the
/// host (`prelude_host.h`) in `out_dir` (a build script's `OUT_DIR`).
/// Panics with the reason when the source cannot be read: a build script
/// stops there.
pub fn scan(device: &Path, out_dir: &Path) -> Vec<Kernel> {
    scan_header(device, &device.join("kernels.h"), out_dir)
}

/// The kernels of `header` (a file written like `kernels.h`, included
/// after `prelude_host.h` from `device`), as [`scan`] reads them.
pub fn scan_header(device: &Path, header: &Path, out_dir: &Path) -> Vec<Kernel> {
    let stem = header
        .file_stem()
        .map_or("kernels".into(), |s| s.to_string_lossy().into_owned());
    let scan = out_dir.join(format!("toast_kernel_scan_{stem}.c"));
    std::fs::write(
        &scan,
        format!(
            "#include \"prelude_host.h\"\n#include \"{}\"\n",
            header.display()
        ),
    )
    .expect("write the scan source");
    let expanded = cc::Build::new()
        .include(device)
        .std("c11")
        .define("TOAST_HOST_KERNEL", MARKER)
        .file(&scan)
        .expand();
    let found = kernels(&String::from_utf8_lossy(&expanded));
    assert!(!found.is_empty(), "no KERNEL found in {}", header.display());
    found
}

/// How a kernel parameter is passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pointer,
    I64,
    U64,
    I32,
    U8,
    F64,
    F32,
}

impl Kind {
    /// The variant's name (`ParamKind::NAME` in the generated tables).
    pub fn rust(self) -> &'static str {
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

/// One parameter of a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// The parameter's name in the prototype.
    pub name: String,
    /// The C type, `restrict` removed (and top-level `const` for scalars).
    pub ctype: String,
    /// How it is passed.
    pub kind: Kind,
}

/// One kernel: its name and its parameters in prototype order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// The kernel's name.
    pub name: String,
    /// Its parameters, in order.
    pub params: Vec<Param>,
    /// Whether it reaches a block barrier (`BLOCK_BARRIER`, which calls
    /// [`BARRIER_CALL`] on the host), directly or through the functions it
    /// calls: the emulator runs such a kernel's threads on fibers.
    pub barrier: bool,
}

/// The function the host prelude's `BLOCK_BARRIER` calls.
pub const BARRIER_CALL: &str = "toast_emu_barrier";

/// The functions of the preprocessed source that reach [`BARRIER_CALL`],
/// following calls: every `NAME ( ... ) {` at file scope is a function
/// definition, its body the tokens up to the matching `}`, and a function
/// reaches the barrier when its body names the barrier call or a function
/// that reaches it (calls through pointers do not exist in the device
/// source).
fn barrier_functions(t: &[String]) -> std::collections::HashSet<String> {
    use std::collections::{HashMap, HashSet};
    let mut bodies: HashMap<String, HashSet<String>> = HashMap::new();
    let (mut i, mut depth) = (0, 0usize);
    while i < t.len() {
        match t[i].as_str() {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "(" if depth == 0 && i > 0 => {
                // A parenthesised list at file scope: a definition when a
                // `{` follows its closing `)`.
                let name = t[i - 1].clone();
                let (mut j, mut d) = (i + 1, 1usize);
                while j < t.len() && d > 0 {
                    match t[j].as_str() {
                        "(" => d += 1,
                        ")" => d -= 1,
                        _ => {}
                    }
                    j += 1;
                }
                if t.get(j).map(String::as_str) == Some("{") {
                    let (mut k, mut d) = (j + 1, 1usize);
                    let mut names = HashSet::new();
                    while k < t.len() && d > 0 {
                        match t[k].as_str() {
                            "{" => d += 1,
                            "}" => d -= 1,
                            tok => {
                                names.insert(tok.to_string());
                            }
                        }
                        k += 1;
                    }
                    bodies.entry(name).or_default().extend(names);
                    i = k;
                    continue;
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    let mut reach: HashSet<String> = HashSet::new();
    loop {
        let before = reach.len();
        for (f, names) in &bodies {
            if !reach.contains(f)
                && (names.contains(BARRIER_CALL) || names.iter().any(|n| reach.contains(n)))
            {
                reach.insert(f.clone());
            }
        }
        if reach.len() == before {
            return reach;
        }
    }
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
            name: name.clone(),
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
            "{kernel}: parameter `{name}` has a type no launcher can pass: `{}`",
            other.join(" ")
        ),
    };
    Param {
        name: name.clone(),
        ctype: base.join(" "),
        kind,
    }
}

/// Every `MARKER void NAME ( ... )` in the preprocessed source.
pub fn kernels(preprocessed: &str) -> Vec<Kernel> {
    let t = tokens(preprocessed);
    let barrier = barrier_functions(&t);
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
        let barrier = barrier.contains(&name);
        out.push(Kernel {
            name,
            params,
            barrier,
        });
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_types_and_kinds_in_order() {
        let src = format!(
            "# 1 \"kernels.h\"\nstatic double helper(double x) {{ return x; }}\n\
             {MARKER} void toast_k(long long a, const int * restrict idx,\n\
             double s, u8 m_unused_name_, float f) {{ }}\n\
             {MARKER} void toast_none(void) {{ }}\n\
             static void sync_(void) {{ {BARRIER_CALL}(); }}\n\
             static void reduce_(double *r) {{ if (r) {{ sync_(); }} }}\n\
             {MARKER} void toast_block(double *r) {{ {{ reduce_(r); }} }}\n"
        );
        let ks = kernels(&src);
        assert_eq!(ks.len(), 3);
        // Only the kernel that calls the barrier, two calls down, runs on fibers.
        let b: Vec<bool> = ks.iter().map(|k| k.barrier).collect();
        assert_eq!(b, [false, false, true]);
        assert_eq!(ks[0].name, "toast_k");
        let got: Vec<(&str, Kind)> = ks[0]
            .params
            .iter()
            .map(|p| (p.name.as_str(), p.kind))
            .collect();
        assert_eq!(
            got,
            [
                ("a", Kind::I64),
                ("idx", Kind::Pointer),
                ("s", Kind::F64),
                ("m_unused_name_", Kind::U8),
                ("f", Kind::F32),
            ]
        );
        assert_eq!(ks[0].params[1].ctype, "const int *");
        assert!(ks[1].params.is_empty());
    }
}
