//! PMI-1 ("simple PMI", v1.1) for vmfabric: the bootstrap protocol by which ranks learn their rank and
//! size and exchange addresses before the fabric is up.
//!
//! The wire format is the one MPICH's `simple_pmi` and Hydra's `pmi_proxy` speak: newline-terminated text
//! lines `cmd=NAME key=value key=value` over a stream socket (the inherited descriptor `PMI_FD`, or TCP to
//! `PMI_PORT`). Because words are separated by spaces, **keys and values may not contain whitespace, `=`
//! or newlines**; such strings are rejected with [`PmiError::InvalidArgument`].
//!
//! * Rank side: [`PmiClient`] (`from_env`, `put`, `get`, `fence`, `spawn`, `abort`, `finalize`, ...). It works with
//!   vmfabric's own launcher (`vmf-launch`) and with Hydra (`mpiexec`).
//! * Launcher side: [`JobKvs`] (the job's key-value space and reusable barrier) and [`serve_connection`]
//!   (one rank's handler), reporting [`PmiEvent`]s (abort, disconnect, spawn requests) to the launcher.
//! * Dynamic processes: [`PmiClient::spawn`] sends MPICH's multi-line `mcmd=spawn` request ([`SpawnCmd`]);
//!   the server hands it to the launcher as [`PmiEvent::Spawn`] and answers with what the launcher says
//!   through the event's [`SpawnReply`].
//!
//! Every error is a [`PmiError`] whose message reads "Unable to <op> since <why>".
//!
//! # Examples
//! A rank:
//! ```no_run
//! use vmf_pmi::PmiClient;
//! # fn main() -> Result<(), vmf_pmi::PmiError> {
//! if let Some(mut pmi) = PmiClient::from_env()? {
//!     let me = pmi.rank();
//!     pmi.put(&format!("addr-{me}"), "0a0b0c")?;
//!     pmi.fence()?;
//!     let peer = (me + 1) % pmi.size();
//!     let _addr = pmi.get(&format!("addr-{peer}"))?;
//!     pmi.finalize()?;
//! }
//! # Ok(()) }
//! ```
//! Both sides in one process (what the tests do):
//! ```
//! use std::{os::unix::net::UnixStream, sync::Arc};
//! use vmf_pmi::{serve_connection, JobKvs, PmiClient};
//! let kvs = Arc::new(JobKvs::new("vmf-demo", 1));
//! let (ours, theirs) = UnixStream::pair().unwrap();
//! let k = kvs.clone();
//! let server = std::thread::spawn(move || serve_connection(ours, 0, k, |_ev| {}));
//! let mut pmi = PmiClient::from_stream(theirs, 0, 1).unwrap();
//! pmi.put("k", "v").unwrap();
//! pmi.fence().unwrap();
//! assert_eq!(pmi.get("k").unwrap(), "v");
//! pmi.finalize().unwrap();
//! drop(pmi);
//! server.join().unwrap().unwrap();
//! ```
#![warn(missing_docs)]

mod client;
mod error;
mod server;
mod spawn;
pub mod wire;

pub use client::PmiClient;
pub use error::PmiError;
pub use server::{
    serve_connection, JobKvs, KvsStore, PmiEvent, KEYLEN_MAX, KVSNAME_MAX, VALLEN_MAX,
};
pub use spawn::{
    SpawnCmd, SpawnReply, SpawnResult, SPAWN_MAX_ARGS, SPAWN_MAX_CMDS, SPAWN_MAX_PAIRS,
    SPAWN_MAX_PROCS,
};

#[cfg(test)]
mod spawn_tests;
#[cfg(test)]
mod tests;
