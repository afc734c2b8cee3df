//! Host ↔ guest agent protocol over TCP (virtio-net).
//!
//! The host opens a connection and sends one JSON line, a request:
//! `{"cmd":"info"}`, `{"cmd":"poweroff"}`, `{"cmd":"release-region"}` or
//! `{"cmd":"run","job":ID,"ranks":[{"rank":R,"argv":[..],"env":[[K,V],..],"cwd":DIR}, ..]}`.
//! `info`, `poweroff` and `release-region` are answered with one JSON line. After `run` the agent sends
//! frames (below) until every rank it started has exited, then a `Done` frame; meanwhile the host may send
//! lines `kill <signal>` (to every rank of the job). A connection closed by the host kills the ranks.
//!
//! Every request carries the cluster's `token` ([`token`]); the agent answers a request without it with
//! an error and nothing else.
//!
//! A frame is `kind: u8`, `rank: u32 LE`, `len: u32 LE`, then `len` bytes. Frames are validated: an
//! unknown kind or a length over [`MAX_FRAME`] is a protocol error, never a large allocation.
use std::io::{Read, Write};

/// The token every request carries: 32 hex digits made by the host when it boots the guests, kept in
/// `<state dir>/token` (mode 0600; the guests read it through their 9p view of the host, never from
/// the kernel command line, which any host user can read). Without it anyone able to reach a guest's
/// address could run commands as root in it.
pub fn token_path() -> std::path::PathBuf {
    crate::cluster::state_dir().join("token")
}

/// The token, read on the host or, inside a guest, through the host's files under `/run/host`.
pub fn token() -> Option<String> {
    let p = token_path();
    let host = std::path::Path::new(crate::agent::HOST_RW).join(p.strip_prefix("/").unwrap_or(&p));
    [p, host]
        .iter()
        .find_map(|f| std::fs::read_to_string(f).ok())
        .map(|t| t.trim().to_owned())
        .filter(|t| t.len() == 32)
}

/// `req` with the token added.
pub fn with_token(req: &serde_json::Value) -> serde_json::Value {
    let mut r = req.clone();
    if let (Some(o), Some(t)) = (r.as_object_mut(), token()) {
        o.insert("token".into(), serde_json::Value::String(t));
    }
    r
}

/// Largest frame payload.
pub const MAX_FRAME: u32 = 1 << 20;
/// The agent's TCP port in the guest.
pub const AGENT_PORT: u16 = 7070;

/// What a frame carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Bytes the rank wrote to stdout.
    Stdout(u32, Vec<u8>),
    /// Bytes the rank wrote to stderr.
    Stderr(u32, Vec<u8>),
    /// The rank started with this pid (in the guest).
    Started(u32, u32),
    /// The rank ended: exit code, or 128 + signal.
    Exit(u32, i32),
    /// The rank could not be started: why.
    SpawnFailed(u32, String),
    /// Every rank of the request has ended.
    Done,
}

impl Frame {
    /// Serialise.
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let (k, r, d): (u8, u32, Vec<u8>) = match self {
            Frame::Stdout(r, d) => (1, *r, d.clone()),
            Frame::Stderr(r, d) => (2, *r, d.clone()),
            Frame::Started(r, p) => (3, *r, p.to_le_bytes().to_vec()),
            Frame::Exit(r, c) => (4, *r, c.to_le_bytes().to_vec()),
            Frame::SpawnFailed(r, m) => (5, *r, m.as_bytes().to_vec()),
            Frame::Done => (6, 0, Vec::new()),
        };
        let mut b = Vec::with_capacity(9 + d.len());
        b.push(k);
        b.extend_from_slice(&r.to_le_bytes());
        b.extend_from_slice(&(d.len() as u32).to_le_bytes());
        b.extend_from_slice(&d);
        w.write_all(&b)
    }

    /// Read one frame; `Ok(None)` at a clean end of stream.
    pub fn read_from(r: &mut impl Read) -> std::io::Result<Option<Frame>> {
        let mut h = [0u8; 9];
        match r.read_exact(&mut h[..1]) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        r.read_exact(&mut h[1..])?;
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        let rank = u32::from_le_bytes([h[1], h[2], h[3], h[4]]);
        let len = u32::from_le_bytes([h[5], h[6], h[7], h[8]]);
        if len > MAX_FRAME {
            return Err(bad(format!("frame of {len} bytes (at most {MAX_FRAME})")));
        }
        let mut d = vec![0u8; len as usize];
        r.read_exact(&mut d)?;
        let word = |d: &[u8]| -> std::io::Result<[u8; 4]> {
            d.try_into().map_err(|_| bad(format!("frame kind {} needs 4 bytes, has {}", h[0], d.len())))
        };
        Ok(Some(match h[0] {
            1 => Frame::Stdout(rank, d),
            2 => Frame::Stderr(rank, d),
            3 => Frame::Started(rank, u32::from_le_bytes(word(&d)?)),
            4 => Frame::Exit(rank, i32::from_le_bytes(word(&d)?)),
            5 => Frame::SpawnFailed(rank, String::from_utf8_lossy(&d).into_owned()),
            6 => Frame::Done,
            k => return Err(bad(format!("unknown frame kind {k}"))),
        }))
    }
}

/// One rank to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankSpec {
    /// Its rank.
    pub rank: u32,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Working directory (the host's, bound into the guest).
    pub cwd: String,
}

impl RankSpec {
    /// As JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "rank": self.rank,
            "argv": self.argv,
            "env": self.env.iter().map(|(k, v)| [k, v]).collect::<Vec<_>>(),
            "cwd": self.cwd,
        })
    }

    /// From JSON; None when a field is missing or mistyped.
    pub fn from_json(v: &serde_json::Value) -> Option<RankSpec> {
        let strs = |v: &serde_json::Value| -> Option<Vec<String>> {
            v.as_array()?.iter().map(|s| s.as_str().map(str::to_owned)).collect()
        };
        let argv = strs(v.get("argv")?)?;
        if argv.is_empty() {
            return None;
        }
        let env = v
            .get("env")?
            .as_array()?
            .iter()
            .map(|p| {
                let p = strs(p)?;
                (p.len() == 2).then(|| (p[0].clone(), p[1].clone()))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(RankSpec {
            rank: u32::try_from(v.get("rank")?.as_u64()?).ok()?,
            argv,
            env,
            cwd: v.get("cwd")?.as_str()?.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_frames_fail() {
        let fs = vec![
            Frame::Stdout(3, b"hello\n".to_vec()),
            Frame::Stderr(0, vec![]),
            Frame::Started(1, 4242),
            Frame::Exit(2, 137),
            Frame::SpawnFailed(5, "no such file".into()),
            Frame::Done,
        ];
        let mut b = Vec::new();
        for f in &fs {
            f.write_to(&mut b).unwrap();
        }
        let mut r = &b[..];
        for f in &fs {
            assert_eq!(Frame::read_from(&mut r).unwrap().as_ref(), Some(f));
        }
        assert_eq!(Frame::read_from(&mut r).unwrap(), None);
        // Unknown kind, oversized length, short fixed-size payload, truncated frame.
        for bad in [
            vec![9u8, 0, 0, 0, 0, 0, 0, 0, 0],
            vec![1u8, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
            vec![4u8, 0, 0, 0, 0, 2, 0, 0, 0, 1, 2],
            vec![1u8, 0, 0, 0, 0, 5, 0, 0, 0, 1],
        ] {
            assert!(Frame::read_from(&mut &bad[..]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rank_specs_round_trip_and_reject_bad_json() {
        let s = RankSpec {
            rank: 7,
            argv: vec!["./a.out".into(), "x y".into()],
            env: vec![("VMF_SHM".into(), "0".into())],
            cwd: "/tmp/j".into(),
        };
        assert_eq!(RankSpec::from_json(&s.to_json()), Some(s));
        for bad in [
            serde_json::json!({"rank": 1, "argv": [], "env": [], "cwd": "/"}),
            serde_json::json!({"rank": -1, "argv": ["a"], "env": [], "cwd": "/"}),
            serde_json::json!({"rank": 1, "argv": ["a"], "env": [["k"]], "cwd": "/"}),
            serde_json::json!({"rank": 1, "argv": ["a"], "env": []}),
        ] {
            assert_eq!(RankSpec::from_json(&bad), None, "{bad}");
        }
    }
}
