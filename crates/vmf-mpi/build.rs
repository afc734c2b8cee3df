//! Give the shared library the soname of Debian's MPICH, so programs linked against it (or against
//! MPICH itself) record `libmpich.so.12` and load ours when it comes first on the library path.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmpich.so.12");
    println!("cargo:rerun-if-changed=build.rs");
}
