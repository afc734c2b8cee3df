//! Client and server connected by socket pairs in threads.
use super::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

struct Job {
    kvs: Arc<JobKvs>,
    events: mpsc::Receiver<PmiEvent>,
    servers: Vec<JoinHandle<Result<(), PmiError>>>,
    clients: Vec<Option<UnixStream>>,
}

fn job(n: usize) -> Job {
    let kvs = Arc::new(JobKvs::new("vmf-test", n));
    let (tx, rx) = mpsc::channel();
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for rank in 0..n {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (k, tx) = (kvs.clone(), tx.clone());
        servers.push(std::thread::spawn(move || {
            serve_connection(ours, rank, k, move |ev| tx.send(ev).unwrap())
        }));
        clients.push(Some(theirs));
    }
    Job {
        kvs,
        events: rx,
        servers,
        clients,
    }
}

#[test]
fn put_fence_get_across_three_clients_works() {
    let mut j = job(3);
    let ranks: Vec<_> = (0..3)
        .map(|r| {
            let s = j.clients[r].take().unwrap();
            std::thread::spawn(move || -> Result<(), PmiError> {
                let mut c = PmiClient::from_stream(s, r, 3)?;
                assert_eq!((c.rank(), c.size(), c.appnum()), (r, 3, 0));
                assert_eq!(c.kvsname(), "vmf-test");
                assert_eq!(c.vallen_max(), VALLEN_MAX);
                assert_eq!(c.universe_size()?, Some(3));
                for round in 0..4 {
                    c.put(&format!("k{round}-{r}"), &format!("v{round}-{r}"))?;
                    c.fence()?;
                    for p in 0..3 {
                        assert_eq!(c.get(&format!("k{round}-{p}"))?, format!("v{round}-{p}"));
                    }
                }
                c.finalize()?;
                assert!(c.put("a", "b").is_err(), "calls after finalize fail");
                Ok(())
            })
        })
        .collect();
    for t in ranks {
        t.join().unwrap().unwrap();
    }
    for s in j.servers {
        s.join().unwrap().unwrap();
    }
    let evs: Vec<_> = j.events.try_iter().collect();
    assert_eq!(
        evs.iter()
            .filter(|e| matches!(e, PmiEvent::Initialized { .. }))
            .count(),
        3
    );
    assert_eq!(
        evs.iter()
            .filter(|e| matches!(e, PmiEvent::Finalized { .. }))
            .count(),
        3
    );
    assert!(
        !evs.iter()
            .any(|e| matches!(e, PmiEvent::Disconnected { .. })),
        "{evs:?}"
    );
    assert_eq!(j.kvs.get("k3-2").as_deref(), Some("v3-2"));
}

#[test]
fn key_not_found_fails() {
    let mut j = job(1);
    let mut c = PmiClient::from_stream(j.clients[0].take().unwrap(), 0, 1).unwrap();
    let e = c.get("nobody-put-this").unwrap_err();
    assert!(matches!(e, PmiError::KeyNotFound { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("Unable to get key nobody-put-this since"),
        "{e}"
    );
    // The connection stays usable.
    c.put("x", "1").unwrap();
    assert_eq!(c.get("x").unwrap(), "1");
    c.finalize().unwrap();
}

#[test]
fn get_range_returns_a_run_of_keys_in_one_answer_and_fails_on_a_gap() {
    let mut j = job(1);
    let mut c = PmiClient::from_stream(j.clients[0].take().unwrap(), 0, 1).unwrap();
    for k in 0..300 {
        c.put(&format!("card-{k}"), &format!("u{k}:{};10.0.0.{}:{}", k % 7, k % 250, 1000 + k))
            .unwrap();
    }
    c.fence().unwrap();
    let v = c.get_range("card-", 40, 256).unwrap();
    assert_eq!(v.len(), 256);
    for (i, x) in v.iter().enumerate() {
        let k = 40 + i;
        assert_eq!(*x, format!("u{k}:{};10.0.0.{}:{}", k % 7, k % 250, 1000 + k));
    }
    // A missing key fails the whole request, and the connection stays usable.
    assert!(c.get_range("card-", 290, 20).is_err());
    assert!(c.get_range("card-", 0, 5000).is_err(), "count is bounded");
    assert_eq!(c.get("card-7").unwrap(), "u7:0;10.0.0.7:1007");
    c.finalize().unwrap();
}

#[test]
fn invalid_values_are_rejected_fails() {
    let mut j = job(1);
    let mut c = PmiClient::from_stream(j.clients[0].take().unwrap(), 0, 1).unwrap();
    for (k, v) in [
        ("k", "a b"),
        ("k", "a=b"),
        ("k", "a\nb"),
        ("k y", "v"),
        ("", "v"),
    ] {
        let e = c.put(k, v).unwrap_err();
        assert!(matches!(e, PmiError::InvalidArgument { .. }), "{e:?}");
        assert!(e.to_string().starts_with("Unable to put key"), "{e}");
    }
    let long = "x".repeat(VALLEN_MAX + 1);
    assert!(matches!(
        c.put("k", &long),
        Err(PmiError::InvalidArgument { .. })
    ));
    assert!(matches!(
        c.get("a b"),
        Err(PmiError::InvalidArgument { .. })
    ));
    // Nothing invalid reached the server; the empty value is fine.
    c.put("k", "").unwrap();
    assert_eq!(c.get("k").unwrap(), "");
    c.finalize().unwrap();
}

/// A scripted fake server: answers each request line with the given reply lines.
fn fake_server(replies: Vec<&'static str>) -> (UnixStream, JoinHandle<Vec<String>>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || {
        let mut r = BufReader::new(ours.try_clone().unwrap());
        let mut w = ours;
        let mut got = Vec::new();
        for rep in replies {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap() == 0 {
                break;
            }
            got.push(line.trim_end().to_owned());
            w.write_all(rep.as_bytes()).unwrap();
        }
        got
    });
    (theirs, h)
}

const HANDSHAKE: [&str; 4] = [
    "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
    "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n",
    "cmd=appnum appnum=0\n",
    "cmd=my_kvsname kvsname=kvs_1\n",
];

#[test]
fn malformed_server_line_fails() {
    let mut script = HANDSHAKE.to_vec();
    script.push("this is not pmi\n");
    let (s, h) = fake_server(script);
    let mut c = PmiClient::from_stream(s, 0, 2).unwrap();
    assert_eq!(c.keylen_max(), 64);
    let e = c.fence().unwrap_err();
    assert!(matches!(e, PmiError::Malformed { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("Unable to fence since the PMI peer sent a malformed line"),
        "{e}"
    );
    let sent = h.join().unwrap();
    assert_eq!(sent[0], "cmd=init pmi_version=1 pmi_subversion=1");
    assert_eq!(sent[4], "cmd=barrier_in");
    // The server is gone now: EOF is a typed error too.
    let e = c.fence().unwrap_err();
    assert!(
        matches!(e, PmiError::Eof { .. } | PmiError::Io { .. }),
        "{e:?}"
    );
}

#[test]
fn rc_and_unexpected_replies_fail() {
    let mut script = HANDSHAKE.to_vec();
    script.push("cmd=put_result rc=-1 msg=duplicate_key\n");
    script.push("cmd=get_result msg=success rc=0\n");
    script.push("cmd=something_else\n");
    script.push("value=v rc=0 cmd=get_result extra=ignored\n");
    let (s, _h) = fake_server(script);
    let mut c = PmiClient::from_stream(s, 1, 2).unwrap();
    let e = c.put("a", "b").unwrap_err();
    assert!(matches!(e, PmiError::Failed { rc: -1, .. }), "{e:?}");
    assert!(e.to_string().contains("duplicate_key"), "{e}");
    assert!(
        matches!(c.get("a"), Err(PmiError::Malformed { .. })),
        "missing value= is malformed"
    );
    assert!(matches!(c.get("a"), Err(PmiError::Unexpected { .. })));
    assert_eq!(
        c.get("a").unwrap(),
        "v",
        "key order and unknown keys do not matter"
    );
}

#[test]
fn server_answers_malformed_and_unknown_lines_works() {
    let mut j = job(1);
    let s = j.clients[0].take().unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut ask = |line: &str| {
        w.write_all(line.as_bytes()).unwrap();
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        wire::Message::parse(&l).unwrap()
    };
    assert_eq!(ask("garbage\n").rc(), Ok(-1));
    assert_eq!(ask("cmd=frobnicate\n").rc(), Ok(-1));
    let m = ask("cmd=init pmi_version=2 pmi_subversion=0\n");
    assert_eq!((m.cmd.as_str(), m.rc()), ("response_to_init", Ok(-1)));
    let m = ask("cmd=init pmi_version=1 pmi_subversion=1\n");
    assert_eq!(m.rc(), Ok(0));
    let m = ask("cmd=get kvsname=vmf-test key=nope\n");
    assert_eq!((m.rc(), m.get("msg")), (Ok(-1), Some("key_not_found")));
    let m = ask("cmd=get kvsname=other key=nope\n");
    assert_eq!(m.rc(), Ok(-1));
    drop(w);
    drop(r);
    j.servers.pop().unwrap().join().unwrap().unwrap();
    // Initialised and closed without finalize: reported.
    let evs: Vec<_> = j.events.try_iter().collect();
    assert_eq!(
        evs,
        vec![
            PmiEvent::Initialized { rank: 0 },
            PmiEvent::Disconnected { rank: 0 }
        ]
    );
}

#[test]
fn abort_is_reported_works() {
    let mut j = job(2);
    let mut c = PmiClient::from_stream(j.clients[1].take().unwrap(), 1, 2).unwrap();
    c.abort(7, "").unwrap();
    let ev = loop {
        match j.events.recv_timeout(Duration::from_secs(5)).unwrap() {
            PmiEvent::Initialized { .. } => continue,
            ev => break ev,
        }
    };
    assert_eq!(
        ev,
        PmiEvent::Abort {
            rank: 1,
            code: 7,
            message: None
        }
    );
    // The handler ends after abort; no Disconnected for an aborting rank.
    j.servers.pop().unwrap().join().unwrap().unwrap();
    assert!(j.events.try_iter().next().is_none());
}

#[test]
fn disconnect_does_not_deadlock_barrier_works() {
    let mut j = job(3);
    let s0 = j.clients[0].take().unwrap();
    let s1 = j.clients[1].take().unwrap();
    let waiter = std::thread::spawn(move || {
        let mut c = PmiClient::from_stream(s0, 0, 3).unwrap();
        c.fence()
    });
    // Rank 1 initialises and dies; rank 2 never speaks PMI.
    let c1 = PmiClient::from_stream(s1, 1, 3).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(c1);
    let e = waiter.join().unwrap().unwrap_err();
    assert!(matches!(e, PmiError::Failed { .. }), "{e:?}");
    assert!(e.to_string().starts_with("Unable to fence since"), "{e}");
    let evs: Vec<_> = j.events.iter().take(3).collect();
    assert!(evs.contains(&PmiEvent::Disconnected { rank: 1 }), "{evs:?}");
}

#[test]
fn shutdown_releases_barrier_works() {
    let kvs = Arc::new(JobKvs::new("k", 2));
    let k = kvs.clone();
    let t = std::thread::spawn(move || k.barrier());
    std::thread::sleep(Duration::from_millis(50));
    kvs.shutdown("the job is stopping");
    assert_eq!(t.join().unwrap(), Err("the job is stopping".to_string()));
}

#[test]
fn tcp_initack_handshake_works() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let kvs = Arc::new(JobKvs::new("vmf-tcp", 4));
    let k = kvs.clone();
    let srv = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        serve_connection(s, 2, k, |_| {})
    });
    let mut c = PmiClient::connect_tcp(&addr, Some("2"), None, None).unwrap();
    assert_eq!((c.rank(), c.size()), (2, 4));
    assert_eq!(c.kvsname(), "vmf-tcp");
    c.finalize().unwrap();
    drop(c);
    srv.join().unwrap().unwrap();
}

/// A scripted PMI-2 server (as Slurm's and Hydra's speak it): the PMI-1 `init` naming version 2, then
/// length-prefixed frames. Checks what the client sends and answers each request.
#[test]
fn pmi2_client_handshake_kvs_fence_and_finalize_works() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || {
        let mut r = BufReader::new(ours.try_clone().unwrap());
        let mut w = ours;
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, "cmd=init pmi_version=2 pmi_subversion=0\n");
        w.write_all(b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n").unwrap();
        let mut frame = || {
            let mut len = [0u8; 6];
            std::io::Read::read_exact(&mut r, &mut len).unwrap();
            let n: usize = String::from_utf8_lossy(&len).trim().parse().unwrap();
            let mut b = vec![0u8; n];
            std::io::Read::read_exact(&mut r, &mut b).unwrap();
            String::from_utf8(b).unwrap()
        };
        let answer = |w: &mut UnixStream, body: &str| {
            w.write_all(format!("{:<6}{body}", body.len()).as_bytes()).unwrap();
        };
        assert_eq!(frame(), "cmd=fullinit;pmirank=1;threaded=FALSE;");
        answer(&mut w, "cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank=1;size=3;appnum=0;debugged=FALSE;pmiverbose=FALSE;");
        assert_eq!(frame(), "cmd=job-getid;");
        answer(&mut w, "cmd=job-getid-response;jobid=7.0;rc=0;");
        assert_eq!(frame(), "cmd=kvs-put;key=k1;value=v:1,x;");
        answer(&mut w, "cmd=kvs-put-response;rc=0;");
        assert_eq!(frame(), "cmd=kvs-fence;");
        answer(&mut w, "cmd=kvs-fence-response;rc=0;");
        assert_eq!(frame(), "cmd=kvs-get;jobid=7.0;srcid=-1;key=k1;");
        answer(&mut w, "cmd=kvs-get-response;rc=0;found=TRUE;value=v:1,x;");
        assert_eq!(frame(), "cmd=kvs-get;jobid=7.0;srcid=-1;key=nope;");
        answer(&mut w, "cmd=kvs-get-response;rc=0;found=FALSE;");
        assert_eq!(frame(), "cmd=info-getjobattr;key=universeSize;");
        answer(&mut w, "cmd=info-getjobattr-response;rc=0;found=TRUE;value=8;");
        assert_eq!(frame(), "cmd=finalize;");
        answer(&mut w, "cmd=finalize-response;rc=0;");
    });
    let mut c = PmiClient::from_stream_v2(theirs, 1).unwrap();
    assert!(c.is_v2());
    assert_eq!((c.rank(), c.size(), c.kvsname()), (1, 3, "7.0"));
    assert_eq!(c.vallen_max(), 1024);
    c.put("k1", "v:1,x").unwrap();
    // A ';' cannot travel (servers disagree on its escape): refused before anything is sent.
    assert!(matches!(c.put("k2", "a;b"), Err(PmiError::InvalidArgument { .. })));
    c.fence().unwrap();
    assert_eq!(c.get("k1").unwrap(), "v:1,x");
    assert!(matches!(c.get("nope"), Err(PmiError::KeyNotFound { .. })));
    // No range get and no spawning over PMI-2: errors, without a round trip.
    assert!(c.get_range("k", 0, 2).is_err());
    assert!(c.spawn(&[], &[]).is_err());
    assert_eq!(c.universe_size().unwrap(), Some(8));
    c.finalize().unwrap();
    server.join().unwrap();
}

/// A PMI-2 server that calls this process another rank, or answers garbage, is an error.
#[test]
fn pmi2_client_rejects_a_wrong_rank_and_a_bad_frame_fails() {
    for reply in [
        "cmd=fullinit-response;rc=0;rank=2;size=3;".to_string(),
        "cmd=fullinit-response;rc=0;rank=1;size=1;".to_string(),
        "cmd=fullinit-response;rc=5;errmsg=no;".to_string(),
    ] {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut r = BufReader::new(ours.try_clone().unwrap());
            let mut w = ours;
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            w.write_all(b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n").unwrap();
            w.write_all(format!("{:<6}{reply}", reply.len()).as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        });
        assert!(PmiClient::from_stream_v2(theirs, 1).is_err());
        server.join().unwrap();
    }
    // A length field that is not a number.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || {
        let mut r = BufReader::new(ours.try_clone().unwrap());
        let mut w = ours;
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        w.write_all(b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n").unwrap();
        w.write_all(b"abcdefcmd=x;").unwrap();
        std::thread::sleep(Duration::from_millis(100));
    });
    assert!(matches!(PmiClient::from_stream_v2(theirs, 0), Err(PmiError::Malformed { .. })));
    server.join().unwrap();
}
