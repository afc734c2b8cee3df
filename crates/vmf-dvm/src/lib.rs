//! vmfabric's distributed virtual machine (004_*, Myrland 2012).
//!
//! Compute nodes interpret DASS programs over one shared address space whose pages are kept by page
//! nodes; everything between nodes goes through vmfabric's one-sided operations (`vmf-rma`), so an
//! application runs between processes, emulated hosts and VMs. See docs/dvm.md.
//!
//! Layers: [`isa`] (the instruction set) ← [`asm`] (assembler and verifier) ← [`app`] (applications:
//! nodes.txt and .dass files) ; [`space`] (the paged shared memory and its page-table protocol) and
//! [`sync`] (mutexes, barriers, signals, deadlock detection) over a [`backend::Backend`] (one-sided
//! operations on the page nodes' memory) ← [`vm`] (the interpreter and threads) ← [`node`] (a node of
//! a running application).
pub mod app;
pub mod asm;
pub mod backend;
pub mod isa;
pub mod jit;
pub mod node;
pub mod space;
pub mod sync;
pub mod vm;

#[cfg(test)]
mod vm_tests;
