//! Forwarding of the ranks' stdout and stderr, line by line, optionally tagged with the rank.
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A partial line longer than this is written out without waiting for its newline.
const MAX_PENDING: usize = 64 * 1024;
/// A partial line is written out when no more bytes arrive for this long (prompts, progress output).
const PARTIAL_FLUSH: Duration = Duration::from_millis(100);

/// Splits a byte stream into whole lines and prefixes each with a tag.
#[derive(Debug)]
pub(crate) struct Framer {
    prefix: Option<Vec<u8>>,
    at_line_start: bool,
    pending: Vec<u8>,
}

impl Framer {
    /// A framer that prefixes every line with `prefix` (none: bytes pass unchanged).
    pub(crate) fn new(prefix: Option<String>) -> Self {
        Framer {
            prefix: prefix.map(String::into_bytes),
            at_line_start: true,
            pending: Vec::new(),
        }
    }

    /// Tag used for rank `rank` with `--tag-output`: `[rank] ` (`[sK.rank] ` for spawned job K).
    pub(crate) fn rank_prefix(rank: impl std::fmt::Display) -> String {
        format!("[{rank}] ")
    }

    /// Feed bytes; returns what is ready to be written: every complete line, tagged.
    pub(crate) fn push(&mut self, data: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(data);
        match self.pending.iter().rposition(|&b| b == b'\n') {
            Some(i) => {
                let rest = self.pending.split_off(i + 1);
                let lines = std::mem::replace(&mut self.pending, rest);
                let out = self.tag(&lines);
                if self.pending.len() > MAX_PENDING {
                    let mut out = out;
                    out.extend(self.flush_partial());
                    return out;
                }
                out
            }
            None if self.pending.len() > MAX_PENDING => self.flush_partial(),
            None => Vec::new(),
        }
    }

    /// True if bytes of an unfinished line are held back.
    pub(crate) fn has_partial(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The held-back partial line (tagged if it starts a line); its continuation will not be tagged again.
    pub(crate) fn flush_partial(&mut self) -> Vec<u8> {
        let p = std::mem::take(&mut self.pending);
        self.tag(&p)
    }

    /// At end of stream: the held-back partial line; when tagging, it is terminated with a newline so the
    /// next rank's line starts on a line of its own.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        let mut out = self.flush_partial();
        if self.prefix.is_some() && !self.at_line_start {
            out.push(b'\n');
            self.at_line_start = true;
        }
        out
    }

    fn tag(&mut self, bytes: &[u8]) -> Vec<u8> {
        let Some(prefix) = &self.prefix else {
            if let Some(&last) = bytes.last() {
                self.at_line_start = last == b'\n';
            }
            return bytes.to_vec();
        };
        let mut out = Vec::with_capacity(bytes.len() + prefix.len() * 4);
        for piece in bytes.split_inclusive(|&b| b == b'\n') {
            if self.at_line_start {
                out.extend_from_slice(prefix);
            }
            out.extend_from_slice(piece);
            self.at_line_start = piece.last() == Some(&b'\n');
        }
        out
    }
}

/// Where forwarded bytes go.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
}

impl Sink {
    fn write(self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        // Errors (our stdout closed) are ignored: the rank's pipe is still drained so it never blocks.
        match self {
            Sink::Stdout => {
                let mut o = std::io::stdout().lock();
                let _ = o.write_all(bytes).and_then(|_| o.flush());
            }
            Sink::Stderr => {
                let mut o = std::io::stderr().lock();
                let _ = o.write_all(bytes).and_then(|_| o.flush());
            }
        }
    }
}

/// The forwarding threads of one job.
pub(crate) struct Forwarders {
    state: Arc<FwdState>,
    threads: Vec<JoinHandle<()>>,
}

struct FwdState {
    active: AtomicUsize,
    writing: AtomicUsize,
    last: Mutex<Instant>,
}

impl FwdState {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
    fn idle_for(&self) -> Duration {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }
}

impl Forwarders {
    pub(crate) fn new() -> Self {
        Forwarders {
            state: Arc::new(FwdState {
                active: AtomicUsize::new(0),
                writing: AtomicUsize::new(0),
                last: Mutex::new(Instant::now()),
            }),
            threads: Vec::new(),
        }
    }

    /// Start a thread copying `src` to `sink` through a framer with `prefix`.
    pub(crate) fn spawn<R: Read + AsRawFd + Send + 'static>(
        &mut self,
        name: String,
        src: R,
        prefix: Option<String>,
        sink: Sink,
    ) -> std::io::Result<()> {
        let st = self.state.clone();
        st.active.fetch_add(1, Ordering::AcqRel);
        let res = std::thread::Builder::new().name(name).spawn(move || {
            forward(src, Framer::new(prefix), sink, &st);
            st.touch();
            st.active.fetch_sub(1, Ordering::AcqRel);
        });
        match res {
            Ok(h) => {
                self.threads.push(h);
                Ok(())
            }
            Err(e) => {
                self.state.active.fetch_sub(1, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    /// Wait until every pipe reached end of file, i.e. all output is forwarded. Pipes still held open by
    /// stray descendants of the ranks are given up on after `idle` without output (or `cap` in total); their
    /// threads are left running detached.
    pub(crate) fn finish(mut self, idle: Duration, cap: Duration) {
        let start = Instant::now();
        self.state.touch();
        while self.state.active.load(Ordering::Acquire) > 0 {
            let writing = self.state.writing.load(Ordering::Acquire) > 0;
            if (!writing && self.state.idle_for() >= idle) || start.elapsed() >= cap {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for h in std::mem::take(&mut self.threads) {
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

fn readable_within(fd: RawFd, t: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, t.as_millis() as libc::c_int) };
    r != 0 // ready, or an error: let read() tell
}

fn forward<R: Read + AsRawFd>(mut src: R, mut framer: Framer, sink: Sink, st: &FwdState) {
    let fd = src.as_raw_fd();
    let mut buf = vec![0u8; 64 * 1024];
    let emit = |bytes: Vec<u8>| {
        if !bytes.is_empty() {
            st.writing.fetch_add(1, Ordering::AcqRel);
            sink.write(&bytes);
            st.writing.fetch_sub(1, Ordering::AcqRel);
            st.touch();
        }
    };
    loop {
        if framer.has_partial() && !readable_within(fd, PARTIAL_FLUSH) {
            emit(framer.flush_partial());
        }
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                st.touch();
                emit(framer.push(&buf[..n]));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    emit(framer.finish());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: Vec<u8>) -> String {
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn tagging_prefixes_each_line_works() {
        let mut f = Framer::new(Some(Framer::rank_prefix(3)));
        assert_eq!(s(f.push(b"hello\nwor")), "[3] hello\n");
        assert!(f.has_partial());
        assert_eq!(s(f.push(b"ld\n\nx\ny")), "[3] world\n[3] \n[3] x\n");
        assert_eq!(s(f.flush_partial()), "[3] y");
        // The continuation of a flushed partial line is not tagged again.
        assert_eq!(s(f.push(b"z\nnext\n")), "z\n[3] next\n");
        assert_eq!(s(f.flush_partial()), "");
        assert_eq!(s(f.push(b"tail")), "");
        assert_eq!(s(f.finish()), "[3] tail\n");
        assert_eq!(s(f.finish()), "");
    }

    #[test]
    fn untagged_bytes_pass_unchanged_works() {
        let mut f = Framer::new(None);
        let mut out = f.push(b"a\nb");
        out.extend(f.push(b"c\r\n\xff\x00d"));
        out.extend(f.finish());
        assert_eq!(out, b"a\nbc\r\n\xff\x00d");
    }

    #[test]
    fn huge_partial_line_is_not_held_forever_works() {
        let mut f = Framer::new(Some("[0] ".into()));
        let big = vec![b'x'; MAX_PENDING + 10];
        let out = f.push(&big);
        assert_eq!(out.len(), big.len() + 4);
        assert!(!f.has_partial());
    }
}
