//! The library answers to the driver's soname, `libcuda.so.1`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
