//! Errors of the native API. Every message names this rank, the peer (where there is one) and the operation.
use std::fmt;
use thiserror::Error;
use vmf_transport::TransportError;

/// The operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Initialisation.
    Init,
    /// A send (blocking or not).
    Send,
    /// A receive.
    Recv,
    /// A probe.
    Probe,
    /// Waiting for or testing requests.
    Wait,
    /// A barrier.
    Barrier,
    /// Finalisation.
    Finalize,
    /// Progress in the background of another call.
    Progress,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Init => "init",
            Op::Send => "send",
            Op::Recv => "receive",
            Op::Probe => "probe",
            Op::Wait => "wait",
            Op::Barrier => "barrier",
            Op::Finalize => "finalize",
            Op::Progress => "progress",
        })
    }
}

/// An error of the fabric.
#[derive(Debug, Error, Clone)]
pub enum Error {
    /// A transport failed talking to `peer`.
    #[error("rank {rank}: unable to {op} with rank {peer} since {source}")]
    Transport {
        /// This rank.
        rank: usize,
        /// The peer.
        peer: usize,
        /// Operation.
        op: Op,
        /// Cause.
        source: TransportError,
    },
    /// A peer process died.
    #[error("rank {rank}: unable to {op} since rank {peer} (pid {pid}) died")]
    PeerDead {
        /// This rank.
        rank: usize,
        /// The dead peer.
        peer: usize,
        /// Its pid.
        pid: i32,
        /// Operation.
        op: Op,
    },
    /// A rank argument outside the job.
    #[error(
        "rank {rank}: unable to {op} since rank {peer} does not exist (the job has {size} ranks)"
    )]
    InvalidRank {
        /// This rank.
        rank: usize,
        /// Requested peer.
        peer: i64,
        /// Job size.
        size: usize,
        /// Operation.
        op: Op,
    },
    /// A negative tag where a real tag is needed.
    #[error("rank {rank}: unable to {op} with rank {peer} since tag {tag} is invalid (tags are 0..=2147483647)")]
    InvalidTag {
        /// This rank.
        rank: usize,
        /// The peer.
        peer: i64,
        /// The tag.
        tag: i32,
        /// Operation.
        op: Op,
    },
    /// No channel reaches the peer.
    #[error("rank {rank}: unable to {op} with rank {peer} since no transport reaches it")]
    Unreachable {
        /// This rank.
        rank: usize,
        /// The peer.
        peer: usize,
        /// Operation.
        op: Op,
    },
    /// The message was longer than the receive buffer.
    #[error("rank {rank}: receive from rank {peer} (tag {tag}) truncated a {len}-byte message to {cap} bytes")]
    Truncated {
        /// This rank.
        rank: usize,
        /// The sender.
        peer: usize,
        /// The tag.
        tag: i32,
        /// Message length.
        len: usize,
        /// Buffer length.
        cap: usize,
    },
    /// The context was revoked (MPIX_Comm_revoke, by this process or a peer).
    #[error("rank {rank}: unable to {op} since communication context {ctx} has been revoked")]
    Revoked {
        /// This rank.
        rank: usize,
        /// The revoked context.
        ctx: u32,
        /// Operation.
        op: Op,
    },
    /// A request handle that is not (or no longer) valid.
    #[error("rank {rank}: unable to {op} since the request handle is invalid")]
    InvalidRequest {
        /// This rank.
        rank: usize,
        /// Operation.
        op: Op,
    },
    /// Setup or bootstrap failed.
    #[error("rank {rank}: unable to {op} since {why}")]
    Setup {
        /// This rank (0 if not known yet).
        rank: usize,
        /// Operation.
        op: Op,
        /// Cause.
        why: String,
    },
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
