//! Engine operations used by the MPI library (`vmf-mpi`). A child module of `engine`, so it may use the
//! engine's private state; everything here is additive.
//!
//! - matched probe: [`Engine::improbe`] removes the earliest matching unexpected message from the queue and
//!   hands it out as a [`MatchedMsg`], which only [`Engine::imrecv`] can receive (MPI_Mprobe / MPI_Mrecv);
//! - [`Engine::peek`]: the status of a completed request without freeing it (MPI_Request_get_status);
//! - [`Engine::take_full`]: free a completed request and return its status *and* its error, so a truncated
//!   receive still reports how many bytes it delivered (MPI_ERR_TRUNCATE with a valid status);
//! - revocation (MPIX_Comm_revoke): [`Engine::revoke`] fails this process's pending receives on a set of
//!   contexts and tells the peers to do the same (a `Revoke` packet). On a revoked context every new send,
//!   receive or probe fails with [`Error::Revoked`]; messages that arrive on it are dropped, and their
//!   senders released — a rendezvous by a zero-length CTS, a synchronous send by its acknowledgement — so
//!   no sender waits for a receive that will never be posted. A send still waiting for its receiver then
//!   completes with [`Error::Revoked`]; eager sends already handed to the transport complete normally.
use super::{matches, Engine, Phase, ReqId, State, Status, Unexp, UnexpBody};
use crate::error::{Error, Op, Result};
use vmf_transport::proto::{CtsInfo, FinInfo, Kind};

/// Most contexts one `Revoke` packet may name (an MPI communicator has two).
const MAX_REVOKE: usize = 16;

/// A message removed from the unexpected queue by a matched probe; receive it with [`Engine::imrecv`].
/// Dropping it loses the message (an unreceived rendezvous sender then never completes), so callers keep it
/// until received.
pub struct MatchedMsg {
    u: Unexp,
}

impl MatchedMsg {
    /// The message's status (source, tag, length).
    pub fn status(&self) -> Status {
        let len = unexp_len(&self.u);
        Status {
            source: self.u.src,
            tag: self.u.tag,
            count: len,
            msg_len: len,
            cancelled: false,
        }
    }
}

fn unexp_len(u: &Unexp) -> usize {
    match &u.body {
        UnexpBody::Eager { data, .. } => data.len(),
        UnexpBody::Rts { total, .. } => *total,
    }
}

impl Engine {
    /// Matched probe: drive progress once, then remove the earliest unexpected message matching
    /// (`src`, `tag`, `ctx`) from the queue (in arrival order, so non-overtaking holds) and return it.
    pub fn improbe(&mut self, src: i64, tag: i32, ctx: u32) -> Result<Option<MatchedMsg>> {
        self.check_peer(src, Op::Probe, true)?;
        self.check_tag(src, tag, Op::Probe, true)?;
        self.check_revoked(ctx, Op::Probe)?;
        self.progress()?;
        self.check_revoked(ctx, Op::Probe)?;
        Ok(self.take_unexpected(src, tag, ctx))
    }

    /// Blocking matched probe.
    pub fn mprobe(&mut self, src: i64, tag: i32, ctx: u32) -> Result<MatchedMsg> {
        self.check_peer(src, Op::Probe, true)?;
        self.check_tag(src, tag, Op::Probe, true)?;
        self.check_revoked(ctx, Op::Probe)?;
        self.wait_until(Op::Probe, |e| {
            e.is_revoked(ctx)
                || e.unexpected
                    .iter()
                    .any(|u| matches(src as i32, tag, ctx, u.src, u.tag, u.ctx))
        })?;
        self.check_revoked(ctx, Op::Probe)?;
        Ok(self.take_unexpected(src, tag, ctx).expect("found above"))
    }

    fn take_unexpected(&mut self, src: i64, tag: i32, ctx: u32) -> Option<MatchedMsg> {
        let pos = self
            .unexpected
            .iter()
            .position(|u| matches(src as i32, tag, ctx, u.src, u.tag, u.ctx))?;
        let m = self.unexpected.remove(pos).map(|u| MatchedMsg { u });
        self.unparked();
        m
    }

    /// Receive a message obtained by a matched probe into `buf` (capacity `cap`).
    ///
    /// # Safety
    /// `buf..buf+cap` must stay valid and otherwise untouched until the request completes.
    pub unsafe fn imrecv(&mut self, buf: *mut u8, cap: usize, m: MatchedMsg) -> Result<ReqId> {
        if let Some(e) = &self.fatal {
            return Err(e.clone());
        }
        let u = m.u;
        let id = self.alloc_req();
        {
            let r = &mut self.reqs[id.idx as usize];
            r.is_send = false;
            r.buf = buf;
            r.len = cap;
            r.peer = u.src as i32;
            r.tag = u.tag;
            r.ctx = u.ctx;
            r.phase = Phase::Posted;
        }
        self.deliver_unexpected(id, u)?;
        Ok(id)
    }

    /// The status and error of a completed request, without freeing it; `None` while it is active.
    pub fn peek(&self, id: ReqId) -> Option<(Status, Option<Error>)> {
        let r = self.req(id)?;
        (r.state == State::Done).then(|| (r.status, r.error.clone()))
    }

    /// Free a completed request; return its status together with its error, if any (a truncated receive
    /// keeps the number of bytes it delivered in `count`).
    pub fn take_full(&mut self, id: ReqId) -> Result<(Status, Option<Error>)> {
        let me = self.me;
        let r = self.req_mut(id).ok_or(Error::InvalidRequest {
            rank: me,
            op: Op::Wait,
        })?;
        r.state = State::Free;
        r.gen = r.gen.wrapping_add(1).max(1);
        let st = r.status;
        let err = r.error.take();
        self.free.push(id.idx);
        Ok((st, err))
    }

    /// True if the request is a receive still waiting in the posted queue (not matched yet).
    pub fn is_posted(&self, id: ReqId) -> bool {
        self.req(id)
            .is_some_and(|r| r.state == State::Active && r.phase == Phase::Posted)
    }

    // ---------------------------------------------------------------- revocation

    /// True if context `ctx` has been revoked (by this process or by a peer's `Revoke`).
    #[inline]
    pub fn is_revoked(&self, ctx: u32) -> bool {
        !self.revoked.is_empty() && self.revoked.contains(&ctx)
    }

    /// How many contexts have been revoked so far (grows only): a waiter that watches memory rather than
    /// requests compares it before and after to learn that it must look at its context again.
    pub fn revocations(&self) -> usize {
        self.revoked.len()
    }

    /// Revoke the contexts `ctxs` here and at every process of `peers` (MPIX_Comm_revoke). Local: returns
    /// once the packets are queued; each peer applies them when its progress reads them.
    pub fn revoke(&mut self, ctxs: &[u32], peers: &[usize]) -> Result<()> {
        if ctxs.len() > MAX_REVOKE {
            return Err(Error::Setup {
                rank: self.me,
                op: Op::Send,
                why: format!("{} contexts in one revocation (at most {MAX_REVOKE})", ctxs.len()),
            });
        }
        let bytes: Vec<u8> = ctxs.iter().flat_map(|c| c.to_le_bytes()).collect();
        for &p in peers {
            if p != self.me {
                self.check_peer(p as i64, Op::Send, false)?;
                self.send_ctl(p, Kind::Revoke, &bytes)?;
            }
        }
        self.apply_revoke(ctxs)
    }

    /// A peer's `Revoke` packet: validate it and apply it.
    pub(super) fn handle_revoke(&mut self, peer: usize, payload: &[u8]) -> Result<()> {
        if payload.is_empty() || payload.len() % 4 != 0 || payload.len() / 4 > MAX_REVOKE {
            return Err(self.corrupt(peer, format!("Revoke of {} bytes", payload.len())));
        }
        let ctxs: Vec<u32> = payload
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        self.apply_revoke(&ctxs)
    }

    /// Mark `ctxs` revoked: fail the receives posted on them, drop what waits unexpected on them.
    fn apply_revoke(&mut self, ctxs: &[u32]) -> Result<()> {
        let fresh: Vec<u32> = ctxs.iter().copied().filter(|c| !self.revoked.contains(c)).collect();
        if fresh.is_empty() {
            return Ok(());
        }
        self.revoked.extend_from_slice(&fresh);
        let me = self.me;
        let posted: Vec<ReqId> = self
            .posted
            .iter()
            .copied()
            .filter(|id| fresh.contains(&self.reqs[id.idx as usize].ctx))
            .collect();
        self.posted.retain(|id| !posted.contains(id));
        for id in posted {
            let ctx = self.reqs[id.idx as usize].ctx;
            self.fail(id, Error::Revoked { rank: me, ctx, op: Op::Recv });
        }
        // Sends still waiting for their receiver (a rendezvous before its CTS, a synchronous send before
        // its acknowledgement) complete with the error: the receiver drops them and releases them.
        for r in self.reqs.iter_mut() {
            if r.state == State::Active
                && r.is_send
                && r.phase == Phase::AwaitAck
                && fresh.contains(&r.ctx)
            {
                r.error = Some(Error::Revoked { rank: me, ctx: r.ctx, op: Op::Send });
            }
        }
        let mut i = 0;
        while i < self.unexpected.len() {
            if fresh.contains(&self.unexpected[i].ctx) {
                let u = self.unexpected.remove(i).unwrap();
                self.unparked();
                self.release_sender(u)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// A message on a revoked context will never be received: let its sender complete.
    pub(super) fn release_sender(&mut self, u: Unexp) -> Result<()> {
        match u.body {
            UnexpBody::Eager { data, sync_sreq } => {
                self.recycle(data);
                if let Some(s) = sync_sreq {
                    self.send_ctl(u.src, Kind::SyncAck, FinInfo { sreq: s }.as_bytes())?;
                }
            }
            UnexpBody::Rts { info, .. } => {
                let cts = CtsInfo { sreq: info.sreq, rreq: 0, want: 0, addr: 0, pid: 0 };
                self.send_ctl(u.src, Kind::Cts, cts.as_bytes())?;
            }
        }
        Ok(())
    }

    /// Peers this process knows to have died (reported by an operation; the job ends soon after).
    pub fn failed_peers(&self) -> Vec<usize> {
        match &self.fatal {
            Some(Error::PeerDead { peer, .. }) => vec![*peer],
            _ => Vec::new(),
        }
    }

    /// Fail with [`Error::Revoked`] if `ctx` is revoked.
    #[inline]
    pub(super) fn check_revoked(&self, ctx: u32, op: Op) -> Result<()> {
        if self.is_revoked(ctx) {
            Err(Error::Revoked { rank: self.me, ctx, op })
        } else {
            Ok(())
        }
    }
}
