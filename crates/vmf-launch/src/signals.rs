//! Catching SIGINT, SIGTERM and SIGHUP while a job runs, so the launcher can stop the ranks and clean up.
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

static PENDING: AtomicI32 = AtomicI32::new(0);
static INSTALLED: Mutex<(usize, Vec<(libc::c_int, libc::sigaction)>)> = Mutex::new((0, Vec::new()));

/// The signals the launcher turns into "stop the job".
pub const CAUGHT: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe: one atomic store. The first signal wins.
    let _ = PENDING.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// The first caught signal since the handlers were installed, or 0.
pub fn pending() -> i32 {
    PENDING.load(Ordering::SeqCst)
}

/// Handlers installed for the lifetime of the guard (reference counted across concurrent jobs; the previous
/// dispositions are restored when the last guard drops). Signals that were ignored stay ignored.
pub struct Guard(());

impl Guard {
    /// Install the handlers (or take another reference to them).
    pub fn install() -> Guard {
        let mut g = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
        if g.0 == 0 {
            PENDING.store(0, Ordering::SeqCst);
            for sig in CAUGHT {
                // SAFETY: sigaction with a zeroed, filled-in struct; the handler only stores an atomic.
                unsafe {
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                        || old.sa_sigaction == libc::SIG_IGN
                    {
                        continue;
                    }
                    let mut new: libc::sigaction = std::mem::zeroed();
                    new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                    new.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut new.sa_mask);
                    if libc::sigaction(sig, &new, &mut old) == 0 {
                        g.1.push((sig, old));
                    }
                }
            }
        }
        g.0 += 1;
        Guard(())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut g = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
        g.0 -= 1;
        if g.0 == 0 {
            for (sig, old) in g.1.drain(..) {
                // SAFETY: restoring a disposition saved by sigaction.
                unsafe { libc::sigaction(sig, &old, std::ptr::null_mut()) };
            }
        }
    }
}

/// Conventional name of a signal number, e.g. `SIGKILL`.
pub fn name(sig: i32) -> String {
    let n = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("SIG{sig}"),
    };
    n.to_owned()
}
