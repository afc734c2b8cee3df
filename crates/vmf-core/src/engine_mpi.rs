//! Engine operations used by the MPI library (`vmf-mpi`). A child module of `engine`, so it may use the
//! engine's private state; everything here is additive.
//!
//! - matched probe: [`Engine::improbe`] removes the earliest matching unexpected message from the queue and
//!   hands it out as a [`MatchedMsg`], which only [`Engine::imrecv`] can receive (MPI_Mprobe / MPI_Mrecv);
//! - [`Engine::peek`]: the status of a completed request without freeing it (MPI_Request_get_status);
//! - [`Engine::take_full`]: free a completed request and return its status *and* its error, so a truncated
//!   receive still reports how many bytes it delivered (MPI_ERR_TRUNCATE with a valid status).
use super::{matches, Engine, Phase, ReqId, State, Status, Unexp, UnexpBody};
use crate::error::{Error, Op, Result};

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
        self.progress()?;
        Ok(self.take_unexpected(src, tag, ctx))
    }

    /// Blocking matched probe.
    pub fn mprobe(&mut self, src: i64, tag: i32, ctx: u32) -> Result<MatchedMsg> {
        self.check_peer(src, Op::Probe, true)?;
        self.check_tag(src, tag, Op::Probe, true)?;
        self.wait_until(Op::Probe, |e| {
            e.unexpected
                .iter()
                .any(|u| matches(src as i32, tag, ctx, u.src, u.tag, u.ctx))
        })?;
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
}
