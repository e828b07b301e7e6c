//! The library answers to the runtime's unversioned name, `libamdhip64.so`
//! (never `libamdhip64.so.5`, the name under which the plugin finds ROCm
//! 5's real hiprtc).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libamdhip64.so");
}
