//! Dynamic processes (MPI 4.0 chapter 11.8-11.10; MPICH keeps them in src/mpi/spawn): ports,
//! MPI_Comm_accept/connect, MPI_Comm_join, name publishing, MPI_Comm_spawn(_multiple) and
//! MPI_Comm_get_parent.
//!
//! **Processes of other jobs.** A job's ranks know each other from the launcher; a process of another job
//! (children started by MPI_Comm_spawn, a separate `vmfabric run` that connects to a port, the far end of
//! a socket given to MPI_Comm_join) becomes a peer of the engine at run time
//! (`Engine::add_remote`): it gets a peer index after the job's own ranks, and its traffic goes over TCP,
//! authenticated by a secret the two groups agreed on when they met. Groups and communicators hold peer
//! indices as they hold world ranks, so every communicator operation, point-to-point and collective,
//! works across jobs unchanged; where the members of two jobs must agree on an order (context
//! agreement, Intercomm_merge), they order processes by their identity (job hash, rank), the same in
//! every process.
//!
//! **Ports.** MPI_Open_port listens on a TCP socket of its own and names it
//! `vmfport:<address>#<key>`, the key being 16 random bytes in hexadecimal: only a process that knows the
//! port name can connect. Accept and connect are collective over their communicators: each group gathers
//! its members' cards (job hash, rank, TCP address of the fabric) and agrees on its largest free context
//! id; the two roots exchange cards and ids over the port's connection (the acceptor adds a fresh link
//! secret), each root broadcasts what it got, every member adds the other group's processes as peers, and
//! the roots confirm to each other that their groups are ready before anyone returns, so the first message
//! on the new intercommunicator is never refused. A stranger who connects to a port with the wrong key
//! is dropped and the accept keeps waiting.
//!
//! **MPI_Comm_join** runs the same exchange over the program's socket, both sides symmetric (the link
//! secret is the exclusive-or of a random half from each).
//!
//! **Names** (MPI_Publish_name/Lookup_name/Unpublish_name) live in a directory shared by the jobs of
//! one user on one machine: `$VMF_NAME_DIR`, by default `/tmp/vmfabric-names-<uid>`, a file per service
//! holding the publisher's process id and the port name. A name whose publisher has died is stale and is
//! removed when looked up; MPI_Finalize unpublishes what the process published and closes its ports.
//!
//! **MPI_Comm_spawn** is MPICH's design over PMI: the root opens a port, asks the launcher (`vmfabric
//! run`, or Hydra) with PMI's `spawn` command to start the children as a new job with the port name under
//! `PARENT_ROOT_PORT_NAME` in their key-value space, and the parents accept on it; each child's MPI_Init
//! connects to it over MPI_COMM_WORLD, which makes the intercommunicator MPI_Comm_get_parent returns.
//!
//! Limits: one-sided windows and shared-memory collectives stay within one job (a window over processes
//! of two jobs fails with MPI_ERR_UNSUPPORTED_OPERATION); a process that migrates does not tell processes
//! of other jobs its new address.
use crate::comm::add_comm;
use crate::intercomm::{exchange, leader_bcast};
use crate::*;
use std::ffi::{c_char, c_int, CStr};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

pub(crate) const MPI_ERR_NAME: c_int = 33;
pub(crate) const MPI_ERR_PORT: c_int = 38;
pub(crate) const MPI_ERR_SERVICE: c_int = 41;
pub(crate) const MPI_ERR_SPAWN: c_int = 42;
const MAX_PORT_NAME: usize = 256;
const PORT_PREFIX: &str = "vmfport:";
const MAGIC: &[u8; 8] = b"VMFDYN01";
/// Longest message the roots exchange (cards of up to a few hundred thousand processes).
const MAX_FRAME: usize = 64 << 20;
/// How long a root waits for the other side once their connection exists, or for a port to answer.
const PEER_TIMEOUT: Duration = Duration::from_secs(120);
/// The key of the port name MPI_Comm_spawn passes to the children (MPICH's name).
pub(crate) const PARENT_PORT_KEY: &str = "PARENT_ROOT_PORT_NAME";

/// A port this process opened.
pub(crate) struct Port {
    name: String,
    listener: TcpListener,
    key: [u8; 16],
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Parse a port name into (address, key).
fn parse_port(name: &str) -> R<(SocketAddr, [u8; 16])> {
    let bad = || {
        err(
            MPI_ERR_PORT,
            format!("{name:?} is not a port name from MPI_Open_port"),
        )
    };
    let Some(rest) = name.trim().strip_prefix(PORT_PREFIX) else {
        return bad();
    };
    let Some((addr, key)) = rest.rsplit_once('#') else {
        return bad();
    };
    let (Ok(addr), Some(key)) = (addr.parse::<SocketAddr>(), unhex(key)) else {
        return bad();
    };
    match <[u8; 16]>::try_from(key) {
        Ok(k) => Ok((addr, k)),
        Err(_) => bad(),
    }
}

unsafe fn cstr(p: *const c_char, what: &str) -> R<String> {
    if p.is_null() {
        return err(MPI_ERR_ARG, format!("{what} is NULL"));
    }
    Ok(CStr::from_ptr(p).to_string_lossy().into_owned())
}

fn random16() -> [u8; 16] {
    let mut k = [0u8; 16];
    let _ = getrandom::fill(&mut k);
    k
}

// ------------------------------------------------------------------------------------------------ socket I/O

/// Wait until `fd` is readable (or writable with `out`), keeping the engine going and, under
/// MPI_THREAD_MULTIPLE, letting the other threads of this process use the library meanwhile.
fn wait_fd(fd: RawFd, out: bool, deadline: Option<Instant>, what: &str) -> R {
    let ev = if out { libc::POLLOUT } else { libc::POLLIN };
    let mut first = true;
    loop {
        let mut p = libc::pollfd {
            fd,
            events: ev,
            revents: 0,
        };
        let ms = if first { 0 } else { 5 };
        first = false;
        // SAFETY: one valid pollfd; the library lock is let go while the kernel waits.
        let r = crate::mt::unlocked(|| unsafe { libc::poll(&mut p, 1, ms) });
        if r > 0 {
            return Ok(());
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return err(MPI_ERR_OTHER, format!("poll failed while {what}"));
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            return err(MPI_ERR_PORT, format!("timed out while {what}"));
        }
        state()?.fab.engine().progress().map_err(from_core)?;
    }
}

fn write_all_fd(fd: RawFd, mut buf: &[u8], what: &str) -> R {
    let deadline = Some(Instant::now() + PEER_TIMEOUT);
    while !buf.is_empty() {
        // SAFETY: a live buffer of buf.len() bytes.
        let r = unsafe {
            libc::send(
                fd,
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            buf = &buf[r as usize..];
            continue;
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock => wait_fd(fd, true, deadline, what)?,
            std::io::ErrorKind::Interrupted => {}
            _ => return err(MPI_ERR_PORT, format!("{what}: {e}")),
        }
    }
    Ok(())
}

fn read_exact_fd(fd: RawFd, buf: &mut [u8], deadline: Option<Instant>, what: &str) -> R {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: a live, writable buffer.
        let r = unsafe {
            libc::recv(
                fd,
                buf[got..].as_mut_ptr().cast(),
                buf.len() - got,
                libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            got += r as usize;
            continue;
        }
        if r == 0 {
            return err(
                MPI_ERR_PORT,
                format!("{what}: the other side closed the connection"),
            );
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock => wait_fd(fd, false, deadline, what)?,
            std::io::ErrorKind::Interrupted => {}
            _ => return err(MPI_ERR_PORT, format!("{what}: {e}")),
        }
    }
    Ok(())
}

fn send_frame(fd: RawFd, body: &[u8], what: &str) -> R {
    let mut v = Vec::with_capacity(12 + body.len());
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&(body.len() as u32).to_le_bytes());
    v.extend_from_slice(body);
    write_all_fd(fd, &v, what)
}

fn recv_frame(fd: RawFd, deadline: Option<Instant>, what: &str) -> R<Vec<u8>> {
    let mut h = [0u8; 12];
    read_exact_fd(fd, &mut h, deadline, what)?;
    let len = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
    if &h[..8] != MAGIC || len > MAX_FRAME {
        return err(
            MPI_ERR_PORT,
            format!("{what}: the other side does not speak vmfabric's connect protocol"),
        );
    }
    let mut b = vec![0u8; len];
    read_exact_fd(fd, &mut b, deadline, what)?;
    Ok(b)
}

// ------------------------------------------------------------------------------------------------ cards

/// Who a process is and where it listens.
#[derive(Clone, Debug, PartialEq)]
struct Card {
    job: u64,
    rank: u32,
    addr: SocketAddr,
}

fn put_card(out: &mut Vec<u8>, c: &Card) {
    let a = c.addr.to_string();
    out.extend_from_slice(&c.job.to_le_bytes());
    out.extend_from_slice(&c.rank.to_le_bytes());
    out.extend_from_slice(&(a.len() as u16).to_le_bytes());
    out.extend_from_slice(a.as_bytes());
}

/// Parse cards (validated: a bad peer gives an error, never a panic).
fn get_cards(mut b: &[u8]) -> R<Vec<Card>> {
    let bad = || err(MPI_ERR_PORT, "malformed process description from the other side");
    let mut v = Vec::new();
    while !b.is_empty() {
        if b.len() < 14 {
            return bad();
        }
        let job = u64::from_le_bytes(b[..8].try_into().unwrap());
        let rank = u32::from_le_bytes(b[8..12].try_into().unwrap());
        let n = u16::from_le_bytes(b[12..14].try_into().unwrap()) as usize;
        let Some(a) = b.get(14..14 + n) else {
            return bad();
        };
        let Some(addr) = std::str::from_utf8(a).ok().and_then(|s| s.parse().ok()) else {
            return bad();
        };
        v.push(Card { job, rank, addr });
        b = &b[14 + n..];
    }
    Ok(v)
}

/// This process's card (makes sure the fabric listens on TCP).
fn my_card(st: &State) -> R<Card> {
    let mut e = st.fab.engine();
    let addr = e.tcp_listen_addr().map_err(from_core)?;
    let (job, rank) = e.identity(e.rank());
    Ok(Card { job, rank, addr })
}

/// The cards of the members of communicator `ci`, in rank order, concatenated (collective).
fn group_cards(st: &mut State, ci: usize) -> R<Vec<u8>> {
    let mut mine = Vec::new();
    put_card(&mut mine, &my_card(st)?);
    Ok(crate::coll::allgather_bytes(st, ci, &mine)?.concat())
}

/// Bytes as ints for the broadcasts of `intercomm.rs` (length first).
fn to_ints(b: &[u8]) -> Vec<i32> {
    let mut v = vec![b.len() as i32];
    v.extend(b.chunks(4).map(|c| {
        let mut w = [0u8; 4];
        w[..c.len()].copy_from_slice(c);
        i32::from_le_bytes(w)
    }));
    v
}

fn from_ints(v: &[i32]) -> Vec<u8> {
    let n = v.first().copied().unwrap_or(0).max(0) as usize;
    let mut b: Vec<u8> = v[1.min(v.len())..]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    b.truncate(n);
    b
}

// ------------------------------------------------------------------------------------------------ connecting

/// What the root learnt from the other side.
struct Met {
    ctx: u32,
    secret: [u8; 16],
    cards: Vec<u8>,
}

/// What the root of [`meet`] does to meet the other side: given its group's agreed context and cards,
/// return the connection to the other root and what it learnt.
type Talk<'a> = dyn FnMut(&mut State, u32, &[u8]) -> R<(RawFd, Met)> + 'a;

/// One side of a connection between two groups: the root talks to the other root over `fd` (through
/// `talk`), then every member adds the other group and the roots confirm readiness. Collective over
/// communicator `comm`; returns the new intercommunicator.
fn meet(
    comm: MPI_Comm,
    root: c_int,
    what: &str,
    talk: &mut Talk<'_>,
) -> R<MPI_Comm> {
    let st = state()?;
    let (ci, c) = st.comm(comm)?;
    crate::intercomm::intra_only(c, what)?;
    if root < 0 || root >= c.size {
        return err(
            MPI_ERR_ROOT,
            format!("root {root} is not in the communicator (size {})", c.size),
        );
    }
    let local: Vec<usize> = (0..c.size).map(|r| c.to_world(r)).collect();
    let (my_rank, eh, coll) = (c.rank, c.eh, c.coll);
    let me = local[my_rank as usize];
    let leader = local[root as usize];
    let cards = group_cards(st, ci)?;
    let lmax = crate::comm::new_ctx(st, ci)?;
    let tag = st.comms[ci].as_mut().unwrap().next_coll_tag();
    // The root meets the other side; a failure there is broadcast so the group does not wait for ever.
    let mut fail = None;
    let mut link = Link(-1);
    let mut hdr = vec![-1i32, 0];
    let mut body = Vec::new();
    if my_rank == root {
        match talk(st, lmax, &cards) {
            Ok((f, m)) => {
                link.0 = f;
                let mut b = m.secret.to_vec();
                b.extend_from_slice(&m.cards);
                body = to_ints(&b);
                hdr = vec![m.ctx as i32, body.len() as i32];
            }
            Err(e) => fail = Some(e),
        }
    }
    let st = state()?;
    let h = leader_bcast(st, coll, tag, &local, leader, me, &hdr, 2)?;
    if h[0] < 0 {
        return Err(fail.unwrap_or_else(|| MpiErr {
            code: MPI_ERR_PORT,
            msg: format!("{what} failed at the root (see its error)"),
        }));
    }
    let body = leader_bcast(st, coll, tag, &local, leader, me, &body, h[1] as usize)?;
    let b = from_ints(&body);
    if b.len() < 16 {
        return err(MPI_ERR_INTERN, "short broadcast of the remote group");
    }
    let secret: [u8; 16] = b[..16].try_into().unwrap();
    let remote_cards = get_cards(&b[16..])?;
    if remote_cards.is_empty() {
        return err(MPI_ERR_PORT, "the other side has no processes");
    }
    let ctx = h[0] as u32;
    let mut remote = Vec::with_capacity(remote_cards.len());
    {
        let mut e = st.fab.engine();
        for c in &remote_cards {
            let idx = e
                .add_remote(c.job, c.rank, secret, c.addr)
                .map_err(from_core)?;
            if local.contains(&idx) {
                return err(
                    MPI_ERR_PORT,
                    format!("{what}: a process is in both groups (a port must join disjoint groups)"),
                );
            }
            remote.push(idx);
        }
    }
    crate::comm::ctx_agreed(st, ctx);
    // Everybody has added the other group before anybody returns: barrier, roots confirm, release.
    crate::coll::barrier(st, comm)?;
    let mut ok = vec![1i32];
    if my_rank == root {
        let r = send_frame(link.0, b"ready", what)
            .and_then(|_| recv_frame(link.0, Some(Instant::now() + PEER_TIMEOUT), what));
        if r.is_err() {
            ok = vec![0];
        }
    }
    let st = state()?;
    let tag2 = st.comms[ci].as_mut().unwrap().next_coll_tag();
    let ok = leader_bcast(st, coll, tag2, &local, leader, me, &ok, 1)?;
    if ok[0] != 1 {
        return err(MPI_ERR_PORT, format!("{what}: the other side went away"));
    }
    let n = local.len() as i32;
    let mut c = Comm::new(ctx, my_rank, Some(local), n, eh);
    c.remote = Some(remote);
    Ok(add_comm(st, c))
}

/// MPI_Intercomm_create between groups of several jobs: every member makes the members of the other
/// group it has not met yet its peers (a spawned process and a parent that did not take part in the
/// spawn, for instance). Collective over `local_comm` (`coll`, `local`, `leader`, `me`: its collective
/// context, members, leader and this process); the leader (`lead`: the other leader's peer index, the
/// context and tag on peer_comm) exchanges the groups' cards and a half of the link secret each.
pub(crate) fn meet_over(
    st: &mut State,
    local_comm: MPI_Comm,
    (coll, local, leader, me): (u32, &[usize], usize, usize),
    lead: Option<(usize, u32, i32)>,
) -> R {
    let (ci, _) = st.comm(local_comm)?;
    let cards = group_cards(st, ci)?;
    let tag = st.comms[ci].as_mut().unwrap().next_coll_tag();
    let (mut hdr, mut body) = (vec![-1i32], Vec::new());
    let mut fail = None;
    if let Some((pw, pctx, ptag)) = lead {
        let r = (|| -> R<Vec<u8>> {
            let half = random16();
            let mut mine = half.to_vec();
            mine.extend_from_slice(&cards);
            let mi = to_ints(&mine);
            let n = exchange(st, pctx, ptag, &[pw], &[mi.len() as i32], &[pw], 1)?[0][0];
            if n < 5 || n as usize > MAX_FRAME / 4 {
                return err(MPI_ERR_INTERN, "bad group description from the remote leader");
            }
            let theirs = from_ints(&exchange(st, pctx, ptag, &[pw], &mi, &[pw], n as usize)?[0]);
            if theirs.len() < 16 {
                return err(MPI_ERR_INTERN, "short group description from the remote leader");
            }
            let mut b: Vec<u8> = (0..16).map(|i| half[i] ^ theirs[i]).collect();
            b.extend_from_slice(&theirs[16..]);
            Ok(b)
        })();
        match r {
            Ok(b) => {
                body = to_ints(&b);
                hdr = vec![body.len() as i32];
            }
            Err(e) => fail = Some(e),
        }
    }
    let st = state()?;
    let h = leader_bcast(st, coll, tag, local, leader, me, &hdr, 1)?;
    if h[0] < 0 {
        return Err(fail.unwrap_or_else(|| MpiErr {
            code: MPI_ERR_INTERN,
            msg: "MPI_Intercomm_create failed at the local leader (see its error)".into(),
        }));
    }
    let b = from_ints(&leader_bcast(st, coll, tag, local, leader, me, &body, h[0] as usize)?);
    if b.len() < 16 {
        return err(MPI_ERR_INTERN, "short broadcast of the remote group");
    }
    let secret: [u8; 16] = b[..16].try_into().unwrap();
    {
        let mut e = st.fab.engine();
        for c in get_cards(&b[16..])? {
            e.add_remote(c.job, c.rank, secret, c.addr).map_err(from_core)?;
        }
    }
    // Everybody has added the other group before anybody sends: barrier, leaders confirm, release.
    crate::coll::barrier(st, local_comm)?;
    if let Some((pw, pctx, ptag)) = lead {
        exchange(st, pctx, ptag, &[pw], &[1], &[pw], 1)?;
    }
    let tag2 = st.comms[ci].as_mut().unwrap().next_coll_tag();
    leader_bcast(st, coll, tag2, local, leader, me, &[1], 1)?;
    Ok(())
}

/// The acceptor root: wait for a connector that knows the key, then exchange.
fn accept_root(st: &mut State, port: &str, lmax: u32, cards: &[u8]) -> R<(RawFd, Met)> {
    let Some(i) = st.ports.iter().position(|p| p.name == port) else {
        return err(
            MPI_ERR_PORT,
            format!("{port:?} is not a port this process opened (MPI_Open_port)"),
        );
    };
    let (lfd, key) = (st.ports[i].listener.as_raw_fd(), st.ports[i].key);
    let stream = loop {
        wait_fd(lfd, false, None, "waiting for a connection on a port")?;
        let st = state()?;
        let Some(p) = st.ports.iter().find(|p| p.name == port) else {
            return err(MPI_ERR_PORT, "the port was closed while accepting");
        };
        let Ok((s, _)) = p.listener.accept() else {
            continue;
        };
        let _ = s.set_nonblocking(true);
        let _ = s.set_nodelay(true);
        // A stranger (wrong key, garbage, silence) is dropped; the accept goes on waiting.
        match recv_frame(
            s.as_raw_fd(),
            Some(Instant::now() + Duration::from_secs(10)),
            "reading a connect request",
        ) {
            Ok(k) if k.len() == 16 && k[..] == key[..] => break s,
            _ => continue,
        }
    };
    let fd = stream.as_raw_fd();
    let what = "accepting a connection";
    let theirs = recv_frame(fd, None, what)?;
    if theirs.len() < 4 {
        return err(MPI_ERR_PORT, "short connect request");
    }
    let rmax = u32::from_le_bytes(theirs[..4].try_into().unwrap());
    let secret = random16();
    let mut mine = lmax.to_le_bytes().to_vec();
    mine.extend_from_slice(&secret);
    mine.extend_from_slice(cards);
    send_frame(fd, &mine, what)?;
    let st = state()?;
    st.dyn_links.push(stream);
    Ok((
        fd,
        Met {
            ctx: lmax.max(rmax),
            secret,
            cards: theirs[4..].to_vec(),
        },
    ))
}

/// The connector root: connect to the port, prove the key, exchange.
fn connect_root(st: &mut State, port: &str, lmax: u32, cards: &[u8]) -> R<(RawFd, Met)> {
    let (addr, key) = parse_port(port)?;
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(|e| MpiErr {
        code: MPI_ERR_PORT,
        msg: format!("cannot connect to port {port:?}: {e}"),
    })?;
    let _ = stream.set_nonblocking(true);
    let _ = stream.set_nodelay(true);
    let fd = stream.as_raw_fd();
    let what = "connecting to a port";
    send_frame(fd, &key, what)?;
    let mut mine = lmax.to_le_bytes().to_vec();
    mine.extend_from_slice(cards);
    send_frame(fd, &mine, what)?;
    // The acceptor answers once its whole group has called MPI_Comm_accept: no deadline.
    let theirs = recv_frame(fd, None, what)?;
    if theirs.len() < 20 {
        return err(MPI_ERR_PORT, "short answer from the accepting side");
    }
    let rmax = u32::from_le_bytes(theirs[..4].try_into().unwrap());
    let secret: [u8; 16] = theirs[4..20].try_into().unwrap();
    st.dyn_links.push(stream);
    Ok((
        fd,
        Met {
            ctx: lmax.max(rmax),
            secret,
            cards: theirs[20..].to_vec(),
        },
    ))
}

/// The root-to-root connection `fd` of a [`meet`], forgotten (closed) when the meeting ends, however.
struct Link(RawFd);

impl Drop for Link {
    fn drop(&mut self) {
        if let Ok(st) = state() {
            st.dyn_links.retain(|s| s.as_raw_fd() != self.0);
        }
    }
}

pub(crate) fn accept(port: &str, root: c_int, comm: MPI_Comm) -> R<MPI_Comm> {
    meet(comm, root, "MPI_Comm_accept", &mut |st, lmax, cards| {
        accept_root(st, port, lmax, cards)
    })
}

pub(crate) fn connect(port: &str, root: c_int, comm: MPI_Comm) -> R<MPI_Comm> {
    meet(comm, root, "MPI_Comm_connect", &mut |st, lmax, cards| {
        connect_root(st, port, lmax, cards)
    })
}

/// MPI_Comm_accept / MPI_Comm_connect from C: the port name is significant only at the root.
unsafe fn port_call(
    port_name: *const c_char,
    root: c_int,
    comm: MPI_Comm,
    newcomm: *mut MPI_Comm,
    how: fn(&str, c_int, MPI_Comm) -> R<MPI_Comm>,
) -> R {
    if newcomm.is_null() {
        return err(MPI_ERR_ARG, "newcomm is NULL");
    }
    let is_root = state()?.comm(comm)?.1.rank == root;
    let name = if is_root {
        cstr(port_name, "port_name")?
    } else {
        String::new()
    };
    *newcomm = how(&name, root, comm)?;
    Ok(())
}

/// MPI_Comm_join over the connected socket `fd` (both sides alike).
fn join(fd: c_int) -> R<MPI_Comm> {
    let st = state()?;
    // SAFETY: fstat on a descriptor number.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return err(MPI_ERR_ARG, format!("{fd} is not an open socket"));
    }
    let what = "MPI_Comm_join";
    let mine = my_card(st)?;
    let lmax = crate::comm::ctx_propose(st)?;
    let half = random16();
    let mut out = lmax.to_le_bytes().to_vec();
    out.extend_from_slice(&half);
    put_card(&mut out, &mine);
    send_frame(fd, &out, what)?;
    let theirs = recv_frame(fd, None, what)?;
    if theirs.len() < 20 {
        return err(MPI_ERR_PORT, "short answer from the other side of the socket");
    }
    let rmax = u32::from_le_bytes(theirs[..4].try_into().unwrap());
    let mut secret = [0u8; 16];
    for (i, s) in secret.iter_mut().enumerate() {
        *s = half[i] ^ theirs[4 + i];
    }
    let cards = get_cards(&theirs[20..])?;
    let [c] = cards.as_slice() else {
        return err(MPI_ERR_PORT, "the other side of the socket is not one process");
    };
    if *c == mine {
        return err(MPI_ERR_ARG, "MPI_Comm_join: both ends of the socket are this process");
    }
    let st = state()?;
    let idx = st
        .fab
        .engine()
        .add_remote(c.job, c.rank, secret, c.addr)
        .map_err(from_core)?;
    let ctx = lmax.max(rmax);
    crate::comm::ctx_agreed(st, ctx);
    send_frame(fd, b"ready", what)?;
    recv_frame(fd, Some(Instant::now() + PEER_TIMEOUT), what)?;
    let st = state()?;
    let me = st.fab.rank();
    let eh = st.comm(MPI_COMM_SELF)?.1.eh;
    let mut c = Comm::new(ctx, 0, Some(vec![me]), 1, eh);
    c.remote = Some(vec![idx]);
    Ok(add_comm(st, c))
}

// ------------------------------------------------------------------------------------------------ ports

fn open_port(st: &mut State) -> R<String> {
    let ip = st.fab.engine().tcp_listen_addr().map_err(from_core)?.ip();
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| MpiErr {
        code: MPI_ERR_PORT,
        msg: format!("cannot listen on {ip}: {e}"),
    })?;
    l.set_nonblocking(true).map_err(|e| MpiErr {
        code: MPI_ERR_PORT,
        msg: e.to_string(),
    })?;
    let addr = l.local_addr().map_err(|e| MpiErr {
        code: MPI_ERR_PORT,
        msg: e.to_string(),
    })?;
    let key = random16();
    let name = format!("{PORT_PREFIX}{addr}#{}", hex(&key));
    st.ports.push(Port {
        name: name.clone(),
        listener: l,
        key,
    });
    Ok(name)
}

fn close_port(st: &mut State, name: &str) -> R {
    let Some(i) = st.ports.iter().position(|p| p.name == name.trim()) else {
        return err(
            MPI_ERR_PORT,
            format!("{name:?} is not a port this process opened"),
        );
    };
    st.ports.swap_remove(i);
    Ok(())
}

// ------------------------------------------------------------------------------------------------ names

fn name_dir() -> std::path::PathBuf {
    match std::env::var("VMF_NAME_DIR") {
        Ok(d) if !d.is_empty() => d.into(),
        // SAFETY: getuid cannot fail.
        _ => format!("/tmp/vmfabric-names-{}", unsafe { libc::getuid() }).into(),
    }
}

fn name_file(service: &str) -> std::path::PathBuf {
    name_dir().join(hex(service.as_bytes()))
}

/// (publisher pid, port) of a published service, if its publisher lives; stale entries are removed.
fn read_name(service: &str) -> Option<(i32, String)> {
    let f = name_file(service);
    let s = std::fs::read_to_string(&f).ok()?;
    let (pid, port) = s.split_once('\n')?;
    let pid: i32 = pid.parse().ok()?;
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        let _ = std::fs::remove_file(&f);
        return None;
    }
    Some((pid, port.to_string()))
}

fn publish(st: &mut State, service: &str, port: &str) -> R {
    if service.is_empty() {
        return err(MPI_ERR_SERVICE, "the service name is empty");
    }
    let dir = name_dir();
    let io = |e: std::io::Error| MpiErr {
        code: MPI_ERR_SERVICE,
        msg: format!("cannot publish in {}: {e}", dir.display()),
    };
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io)?;
    }
    let path = name_file(service);
    let tmp = dir.join(format!(".{}-{}", std::process::id(), hex(&random16()[..4])));
    std::fs::write(&tmp, format!("{}\n{}", std::process::id(), port)).map_err(io)?;
    for _ in 0..2 {
        // A hard link is created only if the name is free: two publishers cannot both win.
        match std::fs::hard_link(&tmp, &path) {
            Ok(()) => {
                let _ = std::fs::remove_file(&tmp);
                st.names.push(service.to_string());
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if read_name(service).is_some() {
                    let _ = std::fs::remove_file(&tmp);
                    return err(
                        MPI_ERR_SERVICE,
                        format!("the service name {service:?} is already published"),
                    );
                }
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(io(e));
            }
        }
    }
    let _ = std::fs::remove_file(&tmp);
    err(MPI_ERR_SERVICE, format!("cannot publish {service:?}"))
}

fn unpublish(st: &mut State, service: &str, port: &str) -> R {
    match read_name(service) {
        Some((_, p)) if p.trim() == port.trim() => {
            let _ = std::fs::remove_file(name_file(service));
            st.names.retain(|n| n != service);
            Ok(())
        }
        Some(_) => err(
            MPI_ERR_SERVICE,
            format!("{service:?} is published with another port"),
        ),
        None => err(
            MPI_ERR_SERVICE,
            format!("the service name {service:?} is not published"),
        ),
    }
}

/// MPI_Finalize: unpublish this process's names, close its ports.
pub(crate) fn finalize(st: &mut State) {
    for n in std::mem::take(&mut st.names) {
        if let Some((pid, _)) = read_name(&n) {
            if pid as u32 == std::process::id() {
                let _ = std::fs::remove_file(name_file(&n));
            }
        }
    }
    st.ports.clear();
    st.dyn_links.clear();
}

// ------------------------------------------------------------------------------------------------ spawn

/// One command of MPI_Comm_spawn(_multiple).
struct Cmd {
    exe: String,
    args: Vec<String>,
    n: usize,
    info: Vec<(String, String)>,
}

unsafe fn argv_list(argv: *mut *mut c_char) -> R<Vec<String>> {
    let mut v = Vec::new();
    if argv.is_null() {
        return Ok(v);
    }
    let mut i = 0;
    loop {
        let a = *argv.add(i);
        if a.is_null() {
            return Ok(v);
        }
        v.push(CStr::from_ptr(a).to_string_lossy().into_owned());
        i += 1;
        if i > 1 << 20 {
            return err(MPI_ERR_ARG, "argv is not NULL-terminated");
        }
    }
}

/// Start the children (at the root) and accept them (everybody): collective over `comm`.
fn spawn(cmds: Option<Vec<Cmd>>, root: c_int, comm: MPI_Comm, errcodes: *mut c_int) -> R<MPI_Comm> {
    let st = state()?;
    let (ci, c) = st.comm(comm)?;
    crate::intercomm::intra_only(c, "MPI_Comm_spawn")?;
    if root < 0 || root >= c.size {
        return err(
            MPI_ERR_ROOT,
            format!("root {root} is not in the communicator (size {})", c.size),
        );
    }
    let local: Vec<usize> = (0..c.size).map(|r| c.to_world(r)).collect();
    let (coll, me, leader) = (c.coll, local[c.rank as usize], local[root as usize]);
    let tag = st.comms[ci].as_mut().unwrap().next_coll_tag();
    let mut fail = None;
    let mut res = vec![-1i32, 0];
    let mut port = String::new();
    if let Some(cmds) = cmds {
        let r = (|| -> R<(String, usize)> {
            let total: usize = cmds.iter().map(|c| c.n).sum();
            let port = open_port(st)?;
            let req: Vec<vmf_core::SpawnCmd> = cmds
                .into_iter()
                .map(|c| vmf_core::SpawnCmd {
                    exe: c.exe,
                    args: c.args,
                    maxprocs: c.n,
                    info: c.info,
                })
                .collect();
            if let Err(e) = st
                .fab
                .spawn(&req, &[(PARENT_PORT_KEY.to_string(), port.clone())])
            {
                let _ = close_port(st, &port);
                return err(MPI_ERR_SPAWN, e.to_string());
            }
            Ok((port, total))
        })();
        match r {
            Ok((p, n)) => {
                port = p;
                res = vec![0, n as i32];
            }
            Err(e) => fail = Some(e),
        }
    }
    let st = state()?;
    let r = leader_bcast(st, coll, tag, &local, leader, me, &res, 2)?;
    let fill = |code: c_int, n: usize| {
        if !errcodes.is_null() {
            for i in 0..n {
                // SAFETY: the program passes an array of maxprocs codes (MPI_ERRCODES_IGNORE is NULL).
                unsafe { *errcodes.add(i) = code };
            }
        }
    };
    if r[0] < 0 {
        return Err(fail.unwrap_or_else(|| MpiErr {
            code: MPI_ERR_SPAWN,
            msg: "MPI_Comm_spawn failed at the root (see its error)".into(),
        }));
    }
    let inter = accept(&port, root, comm);
    if !port.is_empty() {
        let _ = close_port(state()?, &port);
    }
    let inter = inter?;
    fill(MPI_SUCCESS, r[1] as usize);
    Ok(inter)
}

/// MPI_Init of a process started by MPI_Comm_spawn: connect to the parents (collective over
/// MPI_COMM_WORLD). Sets the parent intercommunicator.
pub(crate) fn connect_parent(st: &mut State) -> R {
    if std::env::var("PMI_SPAWNED").map_or(true, |v| v.trim() == "0") {
        return Ok(());
    }
    let Some(port) = st.fab.pmi_get(PARENT_PORT_KEY) else {
        return Ok(());
    };
    let inter = connect(&port, 0, MPI_COMM_WORLD)?;
    let st = state()?;
    st.parent = inter;
    st.comm(inter)?.1.name = "MPI_COMM_PARENT".into();
    Ok(())
}

fn put_port(name: &str, out: *mut c_char) {
    let b = name.as_bytes();
    let n = b.len().min(MAX_PORT_NAME - 1);
    // SAFETY: the program passes MPI_MAX_PORT_NAME bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(b.as_ptr(), out as *mut u8, n);
        *out.add(n) = 0;
    }
}

mpi_api! {
    fn MPI_Open_port / PMPI_Open_port(_info: MPI_Info, port_name: *mut c_char) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if port_name.is_null() {
                return err(MPI_ERR_ARG, "port_name is NULL");
            }
            let name = open_port(st)?;
            put_port(&name, port_name);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Open_port", r)
    }
    fn MPI_Close_port / PMPI_Close_port(port_name: *const c_char) -> c_int {
        let r = (|| -> R {
            let name = cstr(port_name, "port_name")?;
            close_port(state()?, &name)
        })();
        fin(MPI_COMM_WORLD, "MPI_Close_port", r)
    }
    fn MPI_Comm_accept / PMPI_Comm_accept(port_name: *const c_char, _info: MPI_Info, root: c_int, comm: MPI_Comm, newcomm: *mut MPI_Comm) -> c_int {
        fin(comm, "MPI_Comm_accept", port_call(port_name, root, comm, newcomm, accept))
    }
    fn MPI_Comm_connect / PMPI_Comm_connect(port_name: *const c_char, _info: MPI_Info, root: c_int, comm: MPI_Comm, newcomm: *mut MPI_Comm) -> c_int {
        fin(comm, "MPI_Comm_connect", port_call(port_name, root, comm, newcomm, connect))
    }
    fn MPI_Comm_join / PMPI_Comm_join(fd: c_int, intercomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            if intercomm.is_null() {
                return err(MPI_ERR_ARG, "intercomm is NULL");
            }
            *intercomm = join(fd)?;
            Ok(())
        })();
        fin(MPI_COMM_SELF, "MPI_Comm_join", r)
    }
    fn MPI_Publish_name / PMPI_Publish_name(service_name: *const c_char, _info: MPI_Info, port_name: *const c_char) -> c_int {
        let r = (|| -> R {
            let s = cstr(service_name, "service_name")?;
            let p = cstr(port_name, "port_name")?;
            publish(state()?, &s, &p)
        })();
        fin(MPI_COMM_WORLD, "MPI_Publish_name", r)
    }
    fn MPI_Unpublish_name / PMPI_Unpublish_name(service_name: *const c_char, _info: MPI_Info, port_name: *const c_char) -> c_int {
        let r = (|| -> R {
            let s = cstr(service_name, "service_name")?;
            let p = cstr(port_name, "port_name")?;
            unpublish(state()?, &s, &p)
        })();
        fin(MPI_COMM_WORLD, "MPI_Unpublish_name", r)
    }
    fn MPI_Lookup_name / PMPI_Lookup_name(service_name: *const c_char, _info: MPI_Info, port_name: *mut c_char) -> c_int {
        let r = (|| -> R {
            state()?;
            let s = cstr(service_name, "service_name")?;
            if port_name.is_null() {
                return err(MPI_ERR_ARG, "port_name is NULL");
            }
            match read_name(&s) {
                Some((_, p)) => {
                    put_port(&p, port_name);
                    Ok(())
                }
                None => err(MPI_ERR_NAME, format!("the service name {s:?} is not published")),
            }
        })();
        fin(MPI_COMM_WORLD, "MPI_Lookup_name", r)
    }
    fn MPI_Comm_get_parent / PMPI_Comm_get_parent(parent: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if parent.is_null() {
                return err(MPI_ERR_ARG, "parent is NULL");
            }
            // A freed or disconnected parent communicator reads as MPI_COMM_NULL.
            let p = st.parent;
            *parent = if p != MPI_COMM_NULL && st.comm(p).is_ok() { p } else { MPI_COMM_NULL };
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Comm_get_parent", r)
    }
    fn MPI_Comm_spawn / PMPI_Comm_spawn(command: *const c_char, argv: *mut *mut c_char, maxprocs: c_int, info: MPI_Info, root: c_int, comm: MPI_Comm, intercomm: *mut MPI_Comm, array_of_errcodes: *mut c_int) -> c_int {
        let r = (|| -> R {
            if intercomm.is_null() {
                return err(MPI_ERR_ARG, "intercomm is NULL");
            }
            let st = state()?;
            let is_root = st.comm(comm)?.1.rank == root;
            // Arguments are significant only at the root.
            let cmds = if is_root {
                let exe = cstr(command, "command")?;
                if maxprocs <= 0 {
                    return err(MPI_ERR_SPAWN, format!("maxprocs {maxprocs} must be positive"));
                }
                Some(vec![Cmd { exe, args: argv_list(argv)?, n: maxprocs as usize, info: crate::info::hints(info)? }])
            } else {
                None
            };
            *intercomm = spawn(cmds, root, comm, array_of_errcodes)?;
            Ok(())
        })();
        fin(comm, "MPI_Comm_spawn", r)
    }
    fn MPI_Comm_spawn_multiple / PMPI_Comm_spawn_multiple(count: c_int, array_of_commands: *mut *mut c_char, array_of_argv: *mut *mut *mut c_char, array_of_maxprocs: *const c_int, array_of_info: *const MPI_Info, root: c_int, comm: MPI_Comm, intercomm: *mut MPI_Comm, array_of_errcodes: *mut c_int) -> c_int {
        let r = (|| -> R {
            if intercomm.is_null() {
                return err(MPI_ERR_ARG, "intercomm is NULL");
            }
            let st = state()?;
            let is_root = st.comm(comm)?.1.rank == root;
            let cmds = if is_root {
                if count <= 0 || array_of_commands.is_null() || array_of_maxprocs.is_null() {
                    return err(MPI_ERR_ARG, format!("count {count} or an array argument is invalid"));
                }
                let mut v = Vec::new();
                for i in 0..count as usize {
                    let n = *array_of_maxprocs.add(i);
                    if n <= 0 {
                        return err(MPI_ERR_SPAWN, format!("maxprocs[{i}] = {n} must be positive"));
                    }
                    let args = if array_of_argv.is_null() { Vec::new() } else { argv_list(*array_of_argv.add(i))? };
                    let info = if array_of_info.is_null() { Vec::new() } else { crate::info::hints(*array_of_info.add(i))? };
                    v.push(Cmd { exe: cstr(*array_of_commands.add(i), "command")?, args, n: n as usize, info });
                }
                Some(v)
            } else {
                None
            };
            *intercomm = spawn(cmds, root, comm, array_of_errcodes)?;
            Ok(())
        })();
        fin(comm, "MPI_Comm_spawn_multiple", r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_names_round_trip_and_reject_garbage() {
        let key = [7u8; 16];
        let name = format!("{PORT_PREFIX}127.0.0.1:4242#{}", hex(&key));
        let (a, k) = parse_port(&name).unwrap();
        assert_eq!(a, "127.0.0.1:4242".parse::<SocketAddr>().unwrap());
        assert_eq!(k, key);
        let v6 = format!("{PORT_PREFIX}[::1]:7#{}", hex(&key));
        assert_eq!(parse_port(&v6).unwrap().0.port(), 7);
        for bad in ["", "tcp://x", "vmfport:127.0.0.1:1", "vmfport:nohost#00", "vmfport:127.0.0.1:1#zz"] {
            assert!(parse_port(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cards_round_trip_and_truncation_is_an_error() {
        let cs = vec![
            Card { job: 1, rank: 2, addr: "10.0.0.1:5".parse().unwrap() },
            Card { job: u64::MAX, rank: 0, addr: "[::1]:9".parse().unwrap() },
        ];
        let mut b = Vec::new();
        cs.iter().for_each(|c| put_card(&mut b, c));
        assert_eq!(get_cards(&b).unwrap(), cs);
        for cut in 1..b.len() {
            if get_cards(&b[..cut]).is_ok() {
                // only a cut between whole cards parses
                assert_eq!(cut, 14 + "10.0.0.1:5".len());
            }
        }
        assert_eq!(from_ints(&to_ints(&b)), b);
        assert_eq!(from_ints(&to_ints(&[])), Vec::<u8>::new());
    }
}
