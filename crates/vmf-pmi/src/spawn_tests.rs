//! Spawn requests: the client's wire format, the server's parsing and validation, the launcher's answer.
use super::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

/// What MPICH 4.0's PMI_Spawn_multiple writes for MPI_Comm_spawn_multiple with two commands: `./worker`
/// (2 processes, arguments "-x" and "a b=c", info wdir and path) and `/bin/helper` (1 process, no
/// arguments, info host), with one preput. Each argN line comes before argcnt; the preputs are repeated
/// in every block.
const MPICH_REQUEST: &str = "mcmd=spawn\nnprocs=2\nexecname=./worker\ntotspawns=2\nspawnssofar=1\n\
arg1=-x\narg2=a b=c\nargcnt=2\npreput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\n\
preput_val_0=tag#0$description#node1$port#40001$ifname#10.0.0.1$\ninfo_num=2\n\
info_key_0=wdir\ninfo_val_0=/tmp/work dir\ninfo_key_1=path\ninfo_val_1=/opt/bin:/usr/bin\nendcmd\n\
mcmd=spawn\nnprocs=1\nexecname=/bin/helper\ntotspawns=2\nspawnssofar=2\nargcnt=0\npreput_num=1\n\
preput_key_0=PARENT_ROOT_PORT_NAME\npreput_val_0=tag#0$description#node1$port#40001$ifname#10.0.0.1$\n\
info_num=1\ninfo_key_0=host\ninfo_val_0=localhost\nendcmd\n";

const PORT: &str = "tag#0$description#node1$port#40001$ifname#10.0.0.1$";

fn expected_cmds() -> Vec<SpawnCmd> {
    vec![
        SpawnCmd {
            exe: "./worker".into(),
            args: vec!["-x".into(), "a b=c".into()],
            maxprocs: 2,
            info: vec![
                ("wdir".into(), "/tmp/work dir".into()),
                ("path".into(), "/opt/bin:/usr/bin".into()),
            ],
        },
        SpawnCmd {
            exe: "/bin/helper".into(),
            args: vec![],
            maxprocs: 1,
            info: vec![("host".into(), "localhost".into())],
        },
    ]
}

fn preput() -> Vec<(String, String)> {
    vec![("PARENT_ROOT_PORT_NAME".into(), PORT.into())]
}

/// A server for one rank whose events go to a channel.
fn server(
    kvs: JobKvs,
) -> (
    UnixStream,
    mpsc::Receiver<PmiEvent>,
    JoinHandle<Result<(), PmiError>>,
) {
    let kvs = Arc::new(kvs);
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        serve_connection(ours, 0, kvs, move |ev| {
            let _ = tx.send(ev);
        })
    });
    (theirs, rx, h)
}

/// Raw access to a server: write bytes, read answer lines.
struct Raw {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Raw {
    fn new(s: UnixStream) -> Raw {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }
    fn write(&mut self, text: &str) {
        self.w.write_all(text.as_bytes()).unwrap();
    }
    fn read(&mut self) -> wire::Message {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        wire::Message::parse(&l).unwrap_or_else(|e| panic!("{e}: {l:?}"))
    }
    fn ask(&mut self, text: &str) -> wire::Message {
        self.write(text);
        self.read()
    }
    /// The connection is still in step: a plain command gets its own answer.
    fn in_step(&mut self) {
        let m = self.ask("cmd=get_my_kvsname\n");
        assert_eq!(
            (m.cmd.as_str(), m.get("kvsname")),
            ("my_kvsname", Some("vmf-spawn"))
        );
    }
}

/// Answer the next spawn event with `answer`; returns its commands and preputs.
fn answer_spawn(
    rx: &mpsc::Receiver<PmiEvent>,
    answer: SpawnResult,
) -> (usize, Vec<SpawnCmd>, Vec<(String, String)>) {
    loop {
        match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
            PmiEvent::Spawn {
                rank,
                cmds,
                preput,
                reply,
            } => {
                assert!(!reply.answered());
                assert!(reply.send(answer));
                assert!(reply.answered());
                assert!(!reply.send(Ok(())), "only the first answer counts");
                return (rank, cmds, preput);
            }
            PmiEvent::Initialized { .. } => continue,
            ev => panic!("unexpected event {ev:?}"),
        }
    }
}

#[test]
fn server_parses_mpich_spawn_multiple_request_works() {
    let (s, rx, h) = server(JobKvs::new("vmf-spawn", 1));
    let mut raw = Raw::new(s);
    // MPICH writes the header with the first argument, then the rest: split the bytes the same way.
    let cut = MPICH_REQUEST.find("arg2=").unwrap();
    raw.write(&MPICH_REQUEST[..cut]);
    std::thread::sleep(Duration::from_millis(20));
    raw.write(&MPICH_REQUEST[cut..]);
    let (rank, cmds, pre) = answer_spawn(&rx, Ok(()));
    assert_eq!(rank, 0);
    assert_eq!(cmds, expected_cmds());
    assert_eq!(pre, preput());
    let m = raw.read();
    assert_eq!((m.cmd.as_str(), m.rc()), ("spawn_result", Ok(0)));
    raw.in_step();
    // A single-command request (MPI_Comm_spawn) without preputs or infos.
    raw.write("mcmd=spawn\nnprocs=3\nexecname=prog\ntotspawns=1\nspawnssofar=1\nargcnt=0\npreput_num=0\ninfo_num=0\nendcmd\n");
    let (_, cmds, pre) = answer_spawn(&rx, Ok(()));
    assert_eq!(
        cmds,
        vec![SpawnCmd {
            exe: "prog".into(),
            maxprocs: 3,
            ..Default::default()
        }]
    );
    assert!(pre.is_empty());
    assert_eq!(raw.read().rc(), Ok(0));
    raw.in_step();
    drop(raw);
    h.join().unwrap().unwrap();
}

#[test]
fn client_sends_mpich_wire_format_works() {
    // A fake server: the handshake, then everything up to the second endcmd, then the answer.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let fake = std::thread::spawn(move || {
        let mut r = BufReader::new(ours.try_clone().unwrap());
        let mut w = ours;
        for rep in [
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
            "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n",
            "cmd=appnum appnum=3\n",
            "cmd=my_kvsname kvsname=kvs_1\n",
        ] {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            w.write_all(rep.as_bytes()).unwrap();
        }
        let mut got = String::new();
        while got.matches("endcmd\n").count() < 2 {
            let mut l = String::new();
            assert!(r.read_line(&mut l).unwrap() > 0);
            got.push_str(&l);
        }
        w.write_all(b"cmd=spawn_result rc=0\n").unwrap();
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        w.write_all(b"cmd=spawn_result rc=-1 errmsg=no_such_host\n")
            .unwrap();
        got
    });
    let mut c = PmiClient::from_stream(theirs, 0, 1).unwrap();
    assert_eq!(c.appnum(), 3);
    assert!(!c.spawned());
    c.spawn(&expected_cmds(), &preput()).unwrap();
    let one = [SpawnCmd {
        exe: "x".into(),
        maxprocs: 1,
        ..Default::default()
    }];
    let e = c.spawn(&one, &[]).unwrap_err();
    assert!(matches!(e, PmiError::Failed { rc: -1, .. }), "{e:?}");
    assert!(e.to_string().contains("no_such_host"), "{e}");
    assert_eq!(fake.join().unwrap(), MPICH_REQUEST);
}

#[test]
fn client_and_server_round_trip_works() {
    let (s, rx, h) = server(
        JobKvs::new("vmf-spawn", 1)
            .with_universe_size(16)
            .with_appnums(vec![2]),
    );
    let t = std::thread::spawn(move || -> Result<(), PmiError> {
        let mut c = PmiClient::from_stream(s, 0, 1)?;
        assert_eq!(c.appnum(), 2);
        assert_eq!(c.universe_size()?, Some(16));
        c.spawn(&expected_cmds(), &preput())?;
        let e = c
            .spawn(&expected_cmds()[1..], &[])
            .expect_err("the launcher refuses");
        assert!(
            e.to_string().contains("executable_/bin/helper_not_found"),
            "{e}"
        );
        c.finalize()
    });
    let (_, cmds, pre) = answer_spawn(&rx, Ok(()));
    assert_eq!((cmds, pre), (expected_cmds(), preput()));
    answer_spawn(&rx, Err("executable /bin/helper not found".into()));
    t.join().unwrap().unwrap();
    h.join().unwrap().unwrap();
}

#[test]
fn client_rejects_invalid_requests_fails() {
    let (s, rx, h) = server(JobKvs::new("vmf-spawn", 1));
    let mut c = PmiClient::from_stream(s, 0, 1).unwrap();
    let ok = SpawnCmd {
        exe: "prog".into(),
        maxprocs: 1,
        ..Default::default()
    };
    let with = |f: &dyn Fn(&mut SpawnCmd)| {
        let mut c = ok.clone();
        f(&mut c);
        vec![c]
    };
    let pp = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    type Request = (Vec<SpawnCmd>, Vec<(String, String)>);
    let bad: Vec<Request> = vec![
        (vec![], vec![]),
        (with(&|c| c.maxprocs = 0), vec![]),
        (with(&|c| c.exe.clear()), vec![]),
        (with(&|c| c.exe = "a\nb".into()), vec![]),
        (
            with(&|c| c.args = vec!["ok".into(), "line\nbreak".into()]),
            vec![],
        ),
        (
            with(&|c| c.info = vec![("wdir".into(), "x\r".into())]),
            vec![],
        ),
        (
            with(&|c| c.info = vec![(String::new(), "x".into())]),
            vec![],
        ),
        (vec![ok.clone()], pp("k", "a b")),
        (vec![ok.clone()], pp("k=1", "v")),
        (vec![ok.clone()], pp("", "v")),
        (vec![ok.clone()], pp("k", &"v".repeat(5000))),
    ];
    for (cmds, pre) in bad {
        let e = c.spawn(&cmds, &pre).unwrap_err();
        assert!(
            matches!(e, PmiError::InvalidArgument { .. }),
            "{cmds:?} {pre:?}: {e:?}"
        );
        assert!(e.to_string().starts_with("Unable to spawn "), "{e}");
    }
    // Nothing reached the server: the next request is the first it sees.
    let t = std::thread::spawn(move || {
        c.spawn(&[ok], &[])?;
        c.finalize()
    });
    let (_, cmds, _) = answer_spawn(&rx, Ok(()));
    assert_eq!(cmds.len(), 1);
    t.join().unwrap().unwrap();
    h.join().unwrap().unwrap();
}

/// A well-formed one-command request with `edit` applied to its lines (`None` removes the line).
fn request(edit: &[(&str, Option<&str>)]) -> String {
    let mut lines: Vec<(String, String)> = [
        ("mcmd", "spawn"),
        ("nprocs", "2"),
        ("execname", "prog"),
        ("totspawns", "1"),
        ("spawnssofar", "1"),
        ("arg1", "a"),
        ("argcnt", "1"),
        ("preput_num", "1"),
        ("preput_key_0", "k"),
        ("preput_val_0", "v"),
        ("info_num", "1"),
        ("info_key_0", "wdir"),
        ("info_val_0", "/tmp"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, v) in edit {
        match (lines.iter().position(|(lk, _)| lk == k), v) {
            (Some(i), Some(v)) => lines[i].1 = v.to_string(),
            (Some(i), None) => {
                lines.remove(i);
            }
            (None, Some(v)) => lines.insert(lines.len() - 1, (k.to_string(), v.to_string())),
            (None, None) => {}
        }
    }
    let mut s: String = lines.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    s.push_str("endcmd\n");
    s
}

#[test]
fn malformed_spawn_requests_get_error_answers_fails() {
    let (s, rx, h) = server(JobKvs::new("vmf-spawn", 1));
    let mut raw = Raw::new(s);
    // The unedited request is valid.
    raw.write(&request(&[]));
    let (_, cmds, pre) = answer_spawn(&rx, Ok(()));
    assert_eq!(
        (cmds[0].args.clone(), cmds[0].maxprocs, pre),
        (
            vec!["a".to_string()],
            2,
            vec![("k".to_string(), "v".to_string())]
        )
    );
    assert_eq!(raw.read().rc(), Ok(0));
    type Edit<'a> = Vec<(&'a str, Option<&'a str>)>;
    let cases: Vec<(Edit, &str)> = vec![
        (vec![("nprocs", Some("0"))], "nprocs=0"),
        (vec![("nprocs", Some("-1"))], "nprocs=-1"),
        (vec![("nprocs", Some("many"))], "nprocs=many"),
        (vec![("nprocs", None)], "nprocs=_is_missing"),
        (vec![("nprocs", Some("99999999999"))], "nprocs=99999999999"),
        (vec![("execname", Some(""))], "execname="),
        (vec![("execname", None)], "execname="),
        (vec![("argcnt", Some("2"))], "arg2=_is_missing"),
        (vec![("argcnt", None)], "argcnt=_is_missing"),
        (vec![("arg3", Some("x"))], "arg3=_was_given_but_argcnt=1"),
        (vec![("argcnt", Some("0"))], "arg1=_was_given_but_argcnt=0"),
        (vec![("argcnt", Some("99999"))], "argcnt=99999"),
        (vec![("preput_val_0", None)], "preput_val_0=_is_missing"),
        (vec![("preput_num", Some("2"))], "preput_num=2"),
        (
            vec![("preput_val_0", Some("two words"))],
            "preput_value_of_k",
        ),
        (vec![("preput_key_0", Some(""))], "preput_key"),
        (
            vec![("info_key_0", None)],
            "info_key_0=_or_info_val_0=_is_missing",
        ),
        (
            vec![("info_key_1", Some("x"))],
            "info_key_1=_was_given_but_info_num=1",
        ),
        (vec![("info_num", Some("x"))], "info_num=x"),
        (vec![("totspawns", Some("0"))], "totspawns"),
        (vec![("totspawns", None)], "totspawns"),
        (
            vec![("spawnssofar", Some("3"))],
            "spawnssofar=3_where_1_was_expected",
        ),
        (vec![("nprocs2", Some("1")), ("color", Some("blue"))], "@ok"),
    ];
    for (edit, want) in cases {
        let req = request(&edit);
        raw.write(&req);
        if want == "@ok" {
            // Unknown keys are ignored.
            answer_spawn(&rx, Ok(()));
            assert_eq!(raw.read().rc(), Ok(0), "{req}");
            continue;
        }
        let m = raw.read();
        assert_eq!(m.cmd, "spawn_result", "{req}");
        assert_eq!(m.rc(), Ok(-1), "{req}");
        let msg = m.get("msg").unwrap_or("");
        assert!(msg.contains(want), "{req}: {msg:?} lacks {want:?}");
        raw.in_step();
    }
    // Lines that are not key=value, keys given twice.
    let bad_line = request(&[]).replace("argcnt=1\n", "argcnt=1\nnot a pair\n");
    let m = raw.ask(&bad_line);
    assert!(
        m.get("msg").unwrap().contains("not_of_the_form_key=value"),
        "{m:?}"
    );
    let twice = request(&[]).replace("argcnt=1\n", "argcnt=1\nnprocs=3\n");
    let m = raw.ask(&twice);
    assert!(
        m.get("msg").unwrap().contains("nprocs=_is_given_twice"),
        "{m:?}"
    );
    raw.in_step();
    // Unknown multi-line commands are answered once their block is complete.
    let m = raw.ask("mcmd=frobnicate\na=b\nendcmd\n");
    assert_eq!((m.cmd.as_str(), m.rc()), ("error", Ok(-1)));
    raw.in_step();
    // spawn_multiple: one answer for the whole request, even when its first command is bad.
    let first = request(&[("totspawns", Some("2")), ("nprocs", Some("0"))]);
    let second = request(&[("totspawns", Some("2")), ("spawnssofar", Some("2"))]);
    raw.write(&first);
    std::thread::sleep(Duration::from_millis(50));
    raw.write(&second);
    let m = raw.read();
    assert_eq!(m.rc(), Ok(-1));
    assert!(
        m.get("msg").unwrap().starts_with("command_1:_nprocs=0"),
        "{m:?}"
    );
    raw.in_step();
    // Commands that disagree on the number of commands, or on a preput.
    let second = request(&[("totspawns", Some("3")), ("spawnssofar", Some("2"))]);
    let m = raw.ask(&(request(&[("totspawns", Some("2"))]) + &second));
    assert!(
        m.get("msg").unwrap().contains("command_2:_totspawns=3"),
        "{m:?}"
    );
    raw.in_step();
    let second = request(&[
        ("totspawns", Some("2")),
        ("spawnssofar", Some("2")),
        ("preput_val_0", Some("w")),
    ]);
    let m = raw.ask(&(request(&[("totspawns", Some("2"))]) + &second));
    assert!(
        m.get("msg")
            .unwrap()
            .contains("preput_key_k_has_a_value_different"),
        "{m:?}"
    );
    raw.in_step();
    // A request interrupted by a plain command: its answer, then the command's.
    raw.write(&request(&[("totspawns", Some("2"))]));
    let m = raw.ask("cmd=get_appnum\n");
    assert_eq!((m.cmd.as_str(), m.rc()), ("spawn_result", Ok(-1)));
    assert!(m.get("msg").unwrap().contains("interrupted"), "{m:?}");
    let m = raw.read();
    assert_eq!((m.cmd.as_str(), m.get("appnum")), ("appnum", Some("0")));
    // An oversized request is read to its end and refused; the connection stays in step.
    let mut big = String::from("mcmd=spawn\nnprocs=1\nexecname=p\ntotspawns=1\nspawnssofar=1\n");
    let n = 3 * SPAWN_MAX_ARGS;
    for i in 1..=n {
        big.push_str(&format!("arg{i}=x\n"));
    }
    big.push_str(&format!("argcnt={n}\npreput_num=0\ninfo_num=0\nendcmd\n"));
    let w = raw.w.try_clone().unwrap();
    let writer = std::thread::spawn(move || (&w).write_all(big.as_bytes()).unwrap());
    let m = raw.read();
    writer.join().unwrap();
    assert_eq!(m.rc(), Ok(-1));
    assert!(m.get("msg").unwrap().contains("longer_than"), "{m:?}");
    raw.in_step();
    // No bad request reached the launcher.
    assert!(
        rx.try_iter().all(|e| !matches!(e, PmiEvent::Spawn { .. })),
        "a bad request was reported"
    );
    drop(raw);
    h.join().unwrap().unwrap();
}

#[test]
fn unanswered_spawn_fails() {
    // A launcher that ignores events (drops the reply): the rank gets an error, not a hang.
    let kvs = Arc::new(JobKvs::new("vmf-spawn", 1));
    let (ours, theirs) = UnixStream::pair().unwrap();
    let k = kvs.clone();
    let h = std::thread::spawn(move || serve_connection(ours, 0, k, |_ev| {}));
    let mut c = PmiClient::from_stream(theirs, 0, 1).unwrap();
    let cmd = [SpawnCmd {
        exe: "prog".into(),
        maxprocs: 1,
        ..Default::default()
    }];
    let e = c.spawn(&cmd, &[]).unwrap_err();
    assert!(e.to_string().contains("spawn_is_not_supported"), "{e}");
    c.finalize().unwrap();
    drop(c);
    h.join().unwrap().unwrap();

    // A launcher that takes the event and drops it later, unanswered.
    let (s, rx, h) = server(JobKvs::new("vmf-spawn", 1));
    let mut raw = Raw::new(s);
    raw.write(&request(&[]));
    let ev = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(matches!(ev, PmiEvent::Spawn { .. }), "{ev:?}");
    std::thread::sleep(Duration::from_millis(150));
    drop(ev);
    let m = raw.read();
    assert_eq!(m.rc(), Ok(-1));
    raw.in_step();
    drop(raw);
    h.join().unwrap().unwrap();

    // A launcher that keeps the event but shuts the job down: the waiting rank is answered.
    let kvs = Arc::new(JobKvs::new("vmf-spawn", 1));
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    let k = kvs.clone();
    let h = std::thread::spawn(move || {
        serve_connection(ours, 0, k, move |ev| {
            let _ = tx.send(ev);
        })
    });
    let mut raw = Raw::new(theirs);
    raw.write(&request(&[]));
    let kept = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    kvs.shutdown("the job has ended");
    let m = raw.read();
    assert_eq!(m.rc(), Ok(-1));
    assert!(m.get("msg").unwrap().contains("the_job_is_ending"), "{m:?}");
    drop(kept);
    drop(raw);
    h.join().unwrap().unwrap();
}

#[test]
fn appnum_and_universe_size_are_per_rank_works() {
    let kvs = Arc::new(
        JobKvs::new("vmf-apps", 3)
            .with_universe_size(12)
            .with_appnums(vec![0, 1, 1]),
    );
    assert_eq!(
        (
            kvs.appnum(0),
            kvs.appnum(2),
            kvs.appnum(9),
            kvs.universe_size()
        ),
        (0, 1, 0, 12)
    );
    let mut hs = Vec::new();
    for rank in 0..3 {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let k = kvs.clone();
        hs.push(std::thread::spawn(move || {
            serve_connection(ours, rank, k, |_| {})
        }));
        let mut c = PmiClient::from_stream(theirs, rank, 3).unwrap();
        assert_eq!(c.appnum(), [0, 1, 1][rank]);
        assert_eq!(c.universe_size().unwrap(), Some(12));
        c.finalize().unwrap();
    }
    for h in hs {
        h.join().unwrap().unwrap();
    }
    // Without the builders: universe = size, appnum 0.
    let plain = JobKvs::new("p", 5);
    assert_eq!((plain.universe_size(), plain.appnum(4)), (5, 0));
}
