//! The layers of `toast-ops` hold: a module's code names only modules of
//! its own layer or of the layers below it (the order of the crate doc,
//! `src/lib.rs`). Doc comments may point anywhere.

use std::path::Path;

/// The layers, bottom to top: a module may use the ones before it.
const LAYERS: &[&str] = &[
    "sysinfo",
    "dist",
    "math",
    "astro",
    "noise_model",
    "io",
    "pixels",
    "exec",
    "ops",
    "templates",
    "mapmaker",
    "sim",
    "workflow",
];

fn layer(name: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == name)
}

/// `(file, line, used module)` of every `crate::NAME` in the code (not
/// in comments) of `path`, a source file or a folder of them.
fn uses(path: &Path, out: &mut Vec<(String, usize, String)>) {
    if path.is_dir() {
        for e in std::fs::read_dir(path).expect("the source folder reads") {
            uses(&e.expect("a directory entry").path(), out);
        }
        return;
    }
    if path.extension().is_none_or(|x| x != "rs") {
        return;
    }
    let text = std::fs::read_to_string(path).expect("a source file reads");
    for (n, line) in text.lines().enumerate() {
        let mut rest = line.split("//").next().unwrap_or("");
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((path.display().to_string(), n + 1, name));
            }
        }
    }
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    for (i, own) in LAYERS.iter().enumerate() {
        let (folder, file) = (src.join(own), src.join(format!("{own}.rs")));
        assert!(
            folder.is_dir() || file.is_file(),
            "layer {own}: no src/{own}/ or src/{own}.rs"
        );
        let mut found = Vec::new();
        for p in [folder, file] {
            if p.exists() {
                uses(&p, &mut found);
            }
        }
        for (f, n, name) in found {
            // Root re-exports (`crate::{MapMaker, ..}`) name no layer.
            if layer(&name).is_some_and(|j| j > i) {
                bad.push(format!("{f}:{n}: {own} uses {name}, a layer above it"));
            }
        }
    }
    assert!(bad.is_empty(), "layer violations:\n{}", bad.join("\n"));
}

#[test]
fn every_module_of_the_crate_is_a_layer() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("lib.rs reads");
    for line in lib.lines() {
        if let Some(m) = line.strip_prefix("pub mod ") {
            let m = m.trim_end_matches(';');
            assert!(layer(m).is_some(), "module {m} is in no layer of this test");
        }
    }
}
