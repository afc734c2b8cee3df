//! An origin's connection to a target's agent: requests go out in order, responses come back in the
//! same order and are placed where the operation wants them (a get's bytes straight into the result
//! buffer).
//!
//! The socket is nonblocking and [`Conn::pump`] always both writes and reads, so an origin that queues
//! many operations never deadlocks with an agent whose answers fill the socket the other way.
use crate::exec::Status;
use crate::wire::{ReqHeader, RespHeader, RESP_HDR};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Where a response goes.
struct Expect {
    /// Destination of the response's data (may be null when none is expected).
    dest: *mut u8,
    /// Bytes the destination holds.
    cap: usize,
    /// Record the status for the caller ([`Conn::take_status`]) instead of latching errors.
    want_status: bool,
}

/// A connection to one agent.
pub(crate) struct Conn {
    s: TcpStream,
    out: Vec<u8>,
    out_pos: usize,
    hdr: [u8; RESP_HDR],
    hdr_got: usize,
    /// Bytes of the current response's data read so far, and its length.
    body: Option<(usize, usize)>,
    expect: VecDeque<Expect>,
    /// Requests sent and responses received (sequence numbers start at 1).
    pub issued: u64,
    pub done: u64,
    /// First failure of an operation that reported no status of its own.
    pub error: Option<Status>,
    /// Statuses wanted by their callers: (sequence, status).
    statuses: VecDeque<(u64, Status)>,
    /// The connection is unusable (a protocol or I/O error).
    pub broken: Option<String>,
    spin: Duration,
    /// The last answer came from the agent's own thread (the target computes): sleep, do not spin.
    target_busy: bool,
}

impl Conn {
    pub(crate) fn new(s: TcpStream, spin: Duration) -> Conn {
        Conn {
            s,
            out: Vec::new(),
            out_pos: 0,
            hdr: [0; RESP_HDR],
            hdr_got: 0,
            body: None,
            expect: VecDeque::new(),
            issued: 0,
            done: 0,
            error: None,
            statuses: VecDeque::new(),
            broken: None,
            spin,
            target_busy: false,
        }
    }

    /// Queue a request (header, encoded runs, payload parts) whose response's data goes to `dest`
    /// (`cap` bytes). Returns its sequence number.
    ///
    /// # Safety
    /// `dest` must stay writable for `cap` bytes until the response is received.
    pub(crate) unsafe fn send(
        &mut self,
        h: &ReqHeader,
        runs: &[u8],
        parts: &[&[u8]],
        dest: *mut u8,
        cap: usize,
        want_status: bool,
    ) -> u64 {
        let mut head = Vec::with_capacity(crate::wire::REQ_HDR + runs.len());
        h.encode(&mut head);
        head.extend_from_slice(runs);
        if self.out_pos >= self.out.len() && self.broken.is_none() {
            // Nothing queued: write straight from the caller's buffers, copy only what does not go.
            self.out.clear();
            self.out_pos = 0;
            let mut all: Vec<&[u8]> = Vec::with_capacity(1 + parts.len());
            all.push(&head);
            all.extend_from_slice(parts);
            let total: usize = all.iter().map(|p| p.len()).sum();
            let mut skip = crate::sock::sendv(self.s.as_raw_fd(), &all).unwrap_or(0);
            if skip < total {
                for b in &all {
                    if skip >= b.len() {
                        skip -= b.len();
                    } else {
                        self.out.extend_from_slice(&b[skip..]);
                        skip = 0;
                    }
                }
            }
        } else {
            self.out.extend_from_slice(&head);
            for p in parts {
                self.out.extend_from_slice(p);
            }
        }
        self.expect.push_back(Expect {
            dest,
            cap,
            want_status,
        });
        self.issued += 1;
        self.issued
    }

    /// Write what is queued and read what arrived; true if anything moved.
    pub(crate) fn pump(&mut self) -> bool {
        if self.broken.is_some() {
            return false;
        }
        let mut moved = false;
        while self.out_pos < self.out.len() {
            match crate::sock::sendv(self.s.as_raw_fd(), &[&self.out[self.out_pos..]]) {
                Ok(0) => {
                    self.broken = Some("the agent closed the connection".into());
                    return moved;
                }
                Ok(n) => {
                    self.out_pos += n;
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.broken = Some(format!("writing to the agent failed: {e}"));
                    return moved;
                }
            }
        }
        if self.out_pos >= self.out.len() && !self.out.is_empty() {
            self.out.clear();
            self.out_pos = 0;
        }
        while self.done < self.issued {
            match self.read_some() {
                Ok(true) => moved = true,
                Ok(false) => break,
                Err(e) => {
                    self.broken = Some(e);
                    break;
                }
            }
        }
        moved
    }

    /// Read part of the current response; Ok(false) when nothing is there.
    fn read_some(&mut self) -> Result<bool, String> {
        if let Some((got, len)) = self.body {
            let e = self.expect.front().expect("a response is due");
            // SAFETY: dest holds cap >= len bytes (checked when the header arrived).
            let dst = unsafe { std::slice::from_raw_parts_mut(e.dest.add(got), len - got) };
            return match self.s.read(dst) {
                Ok(0) => Err("the agent closed the connection".into()),
                Ok(n) => {
                    if got + n == len {
                        self.body = None;
                        self.finish(Status::Ok);
                    } else {
                        self.body = Some((got + n, len));
                    }
                    Ok(true)
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => Ok(true),
                Err(e) => Err(format!("reading from the agent failed: {e}")),
            };
        }
        match self.s.read(&mut self.hdr[self.hdr_got..]) {
            Ok(0) => Err("the agent closed the connection".into()),
            Ok(n) => {
                self.hdr_got += n;
                if self.hdr_got == RESP_HDR {
                    self.hdr_got = 0;
                    let r = RespHeader::decode(&self.hdr);
                    self.target_busy = r.flags & crate::wire::RESP_BY_AGENT_THREAD != 0;
                    let st = Status::from_u32(r.status);
                    let e = self.expect.front().ok_or("a response nobody asked for")?;
                    if r.len > e.cap as u64 || (r.len > 0 && st != Status::Ok) {
                        return Err(format!(
                            "a response of {} bytes where at most {} were due",
                            r.len, e.cap
                        ));
                    }
                    if r.len == 0 {
                        self.finish(st);
                    } else {
                        self.body = Some((0, r.len as usize));
                    }
                }
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(format!("reading from the agent failed: {e}")),
        }
    }

    fn finish(&mut self, st: Status) {
        let e = self.expect.pop_front().expect("a response is due");
        self.done += 1;
        if e.want_status {
            self.statuses.push_back((self.done, st));
        } else if st != Status::Ok && self.error.is_none() {
            self.error = Some(st);
        }
    }

    /// The status of request `seq` (sent with `want_status`), once received.
    pub(crate) fn take_status(&mut self, seq: u64) -> Option<Status> {
        let i = self.statuses.iter().position(|&(s, _)| s == seq)?;
        self.statuses.remove(i).map(|(_, st)| st)
    }

    /// The socket's descriptor.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.s.as_raw_fd()
    }

    /// Everything queued has been written to the socket (the origin's buffers are free again).
    pub(crate) fn written(&self) -> bool {
        self.out_pos >= self.out.len()
    }

    /// Wait until responses up to `seq` are in (or the connection breaks). Polls for `spin`, then
    /// sleeps in `poll(2)`; sleeps at once while the target's answers come from its agent thread (the
    /// target computes outside the library): spinning would take the CPU that thread needs (measured on 2
    /// cores: a get took 35-72 us with the origin spinning, 17 us with it sleeping).
    pub(crate) fn wait(&mut self, seq: u64) -> Result<(), String> {
        let start = Instant::now();
        loop {
            self.pump();
            if let Some(b) = &self.broken {
                return Err(b.clone());
            }
            if self.done >= seq && self.written() {
                return Ok(());
            }
            if !self.target_busy && start.elapsed() < self.spin {
                std::hint::spin_loop();
                continue;
            }
            let mut pfd = libc::pollfd {
                fd: self.s.as_raw_fd(),
                events: libc::POLLIN | if self.written() { 0 } else { libc::POLLOUT },
                revents: 0,
            };
            // SAFETY: one pollfd.
            unsafe { libc::poll(&mut pfd, 1, 100) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// A connection to a fake agent (the returned stream), with one request issued per entry of `dests`,
    /// whose answer goes there (8 bytes each).
    fn pair(dests: &mut [[u8; 8]]) -> (Conn, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (agent, _) = l.accept().unwrap();
        c.set_nonblocking(true).unwrap();
        let mut conn = Conn::new(c, Duration::from_micros(50));
        for d in dests.iter_mut() {
            // SAFETY: the destinations outlive the connection's use in each test.
            unsafe { conn.send(&ReqHeader::default(), &[], &[], d.as_mut_ptr(), 8, false) };
        }
        (conn, agent)
    }

    fn resp(status: u32, data: &[u8], announce: u64) -> Vec<u8> {
        let mut v = Vec::new();
        RespHeader { status, flags: 0, len: announce }.encode(&mut v);
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn one_due_response_is_read_into_place_whole_or_in_pieces() {
        // Header and data in one segment: one read places both.
        let mut d = [[0u8; 8]; 1];
        let (mut c, mut a) = pair(&mut d);
        a.write_all(&resp(0, &7u64.to_le_bytes(), 8)).unwrap();
        c.wait(1).unwrap();
        assert_eq!(u64::from_le_bytes(d[0]), 7);
        assert!(c.error.is_none());
        // The same response trickling in: part of the header, the rest of it with part of the data, the end.
        let mut d = [[0u8; 8]; 1];
        let (mut c, mut a) = pair(&mut d);
        let r = resp(0, &0x1122_3344_5566_7788u64.to_le_bytes(), 8);
        for part in [&r[..5], &r[5..19], &r[19..]] {
            a.write_all(part).unwrap();
            a.flush().unwrap();
            std::thread::sleep(Duration::from_millis(5));
            c.pump();
        }
        c.wait(1).unwrap();
        assert_eq!(u64::from_le_bytes(d[0]), 0x1122_3344_5566_7788);
    }

    #[test]
    fn pipelined_responses_go_to_their_own_destinations() {
        let mut d = [[0u8; 8]; 3];
        let (mut c, mut a) = pair(&mut d);
        let mut all = Vec::new();
        for v in [1u64, 2, 3] {
            all.extend(resp(0, &v.to_le_bytes(), 8));
        }
        a.write_all(&all).unwrap();
        c.wait(3).unwrap();
        assert_eq!(d.map(u64::from_le_bytes), [1, 2, 3]);
    }

    #[test]
    fn responses_that_do_not_fit_break_the_connection() {
        // An error status that carries data.
        let mut d = [[0u8; 8]; 1];
        let (mut c, mut a) = pair(&mut d);
        a.write_all(&resp(3, &[9u8; 8], 8)).unwrap();
        assert!(c.wait(1).is_err());
        // More data than the destination holds.
        let mut d = [[0u8; 8]; 1];
        let (mut c, mut a) = pair(&mut d);
        a.write_all(&resp(0, &[9u8; 16], 16)).unwrap();
        let e = c.wait(1).unwrap_err();
        assert!(e.contains("at most 8"), "{e}");
    }
}
