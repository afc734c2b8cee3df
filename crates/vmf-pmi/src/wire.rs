//! The PMI-1 line format: `cmd=NAME key=value key=value\n`, and the PMI-2 frame (`Message::to_v2` /
//! `Message::parse_v2`): a 6-byte decimal length, then `cmd=NAME;key=value;...;`, as MPICH's PMI-2 client,
//! Hydra and Slurm's `mpi/pmi2` plugin speak it. Servers disagree on escaping a `;` inside a value (MPICH's
//! client doubles it, Hydra's server does not undo that), so the client refuses `;` in what it sends
//! and reads a doubled one as a `;`.
//!
//! Keys and values are separated by single spaces, so neither may contain whitespace or `=` (see
//! [`check_token`]). Parsing is lenient the way Hydra's is: keys may come in any order, unknown keys are
//! kept (and ignored by callers), and a bare word without `=` is appended to the previous value, so a
//! server message such as `msg=key not found` still parses.

/// Longest line accepted from the peer, in bytes (without the newline). Longer lines are malformed.
pub const MAX_LINE: usize = 64 * 1024;

/// One parsed PMI-1 command or response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The value of the `cmd` key.
    pub cmd: String,
    /// All other `key=value` pairs, in arrival order.
    pub fields: Vec<(String, String)>,
}

impl Message {
    /// A message with command `cmd` and no fields.
    pub fn new(cmd: &str) -> Self {
        Message {
            cmd: cmd.to_owned(),
            fields: Vec::new(),
        }
    }

    /// Builder: append the pair `key=value`.
    pub fn with(mut self, key: &str, value: impl ToString) -> Self {
        self.fields.push((key.to_owned(), value.to_string()));
        self
    }

    /// The value of the first field named `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The `rc` field as an integer: `Ok(0)` when absent, `Err` when present but not an integer.
    pub fn rc(&self) -> Result<i64, String> {
        match self.get("rc") {
            None => Ok(0),
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| format!("rc={v} is not an integer")),
        }
    }

    /// Parse one line (a trailing `\n` or `\r\n` is ignored). Errors say what is wrong.
    pub fn parse(line: &str) -> Result<Message, String> {
        let line = line.trim_end_matches(['\n', '\r']);
        if line.len() > MAX_LINE {
            return Err(format!("the line is longer than {MAX_LINE} bytes"));
        }
        let mut pairs: Vec<(String, String)> = Vec::new();
        for tok in line.split_ascii_whitespace() {
            match tok.split_once('=') {
                Some(("", _)) => return Err(format!("the word {tok:?} has an empty key")),
                Some((k, v)) => pairs.push((k.to_owned(), v.to_owned())),
                None => match pairs.last_mut() {
                    Some((_, v)) => {
                        v.push(' ');
                        v.push_str(tok);
                    }
                    None => return Err(format!("the word {tok:?} is not of the form key=value")),
                },
            }
        }
        if pairs.is_empty() {
            return Err("the line is empty".into());
        }
        let pos = pairs.iter().position(|(k, _)| k == "cmd").ok_or_else(|| {
            if pairs.iter().any(|(k, _)| k == "mcmd") {
                "multi-line commands (mcmd=) are not supported".to_string()
            } else {
                "it has no cmd= key".to_string()
            }
        })?;
        let (_, cmd) = pairs.remove(pos);
        if cmd.is_empty() {
            return Err("its cmd= value is empty".into());
        }
        Ok(Message { cmd, fields: pairs })
    }

    /// The wire form, newline-terminated.
    pub fn to_line(&self) -> String {
        let mut s = format!("cmd={}", self.cmd);
        for (k, v) in &self.fields {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            s.push_str(v);
        }
        s.push('\n');
        s
    }
}

/// Length of the decimal length field that starts every PMI-2 frame.
pub const V2_LEN_FIELD: usize = 6;

impl Message {
    /// The PMI-2 wire form: the body's length in a 6-byte field (left-justified, space-padded), then
    /// `cmd=NAME;key=value;...;`. Keys and values must not contain `;` (callers check).
    pub fn to_v2(&self) -> String {
        let mut body = format!("cmd={};", self.cmd);
        for (k, v) in &self.fields {
            body.push_str(k);
            body.push('=');
            body.push_str(v);
            body.push(';');
        }
        format!("{:<width$}{body}", body.len(), width = V2_LEN_FIELD)
    }

    /// Parse a PMI-2 frame body (without its length field): `key=value;` pairs, `;;` an escaped `;`.
    pub fn parse_v2(body: &str) -> Result<Message, String> {
        if body.len() > MAX_LINE {
            return Err(format!("the frame is longer than {MAX_LINE} bytes"));
        }
        let mut pairs: Vec<(String, String)> = Vec::new();
        let mut cur = String::new();
        let mut chars = body.chars().peekable();
        let finish = |cur: &mut String, pairs: &mut Vec<(String, String)>| -> Result<(), String> {
            let item = std::mem::take(cur);
            if item.is_empty() {
                return Ok(());
            }
            match item.split_once('=') {
                Some(("", _)) | None => Err(format!("the item {item:?} is not of the form key=value")),
                Some((k, v)) => {
                    pairs.push((k.to_owned(), v.to_owned()));
                    Ok(())
                }
            }
        };
        while let Some(c) = chars.next() {
            if c == ';' {
                if chars.peek() == Some(&';') {
                    chars.next();
                    cur.push(';');
                } else {
                    finish(&mut cur, &mut pairs)?;
                }
            } else {
                cur.push(c);
            }
        }
        finish(&mut cur, &mut pairs)?;
        let pos = pairs
            .iter()
            .position(|(k, _)| k == "cmd")
            .ok_or_else(|| "it has no cmd= key".to_string())?;
        let (_, cmd) = pairs.remove(pos);
        if cmd.is_empty() {
            return Err("its cmd= value is empty".into());
        }
        Ok(Message { cmd, fields: pairs })
    }
}

/// Check that `s` can travel as a PMI-1 key or value: no whitespace, no `=`, no control characters, and at
/// most `max` bytes. Keys must also be non-empty (`allow_empty == false`). Returns why not.
pub fn check_token(s: &str, max: usize, allow_empty: bool) -> Result<(), String> {
    if s.is_empty() && !allow_empty {
        return Err("it is empty".into());
    }
    if s.len() > max {
        return Err(format!(
            "it is {} bytes long and the limit is {max}",
            s.len()
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| c.is_whitespace() || *c == '=' || c.is_control())
    {
        return Err(format!(
            "it contains {c:?} (PMI-1 values may not contain spaces, '=' or newlines)"
        ));
    }
    Ok(())
}

/// Replace characters that cannot travel in a PMI-1 value by `_` (used for free-text `msg=` fields).
pub fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_whitespace() || c == '=' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if out.is_empty() {
        "_".into()
    } else {
        out
    }
}

/// Replace whitespace and control characters by `_` (used for the free-text `msg=` of spawn answers, which
/// may keep `=`: both our parser and MPICH's take a value up to the next space).
pub fn sanitize_text(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if out.is_empty() {
        "_".into()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_is_order_independent_and_lenient_works() {
        let m = Message::parse("rc=0 value=abc cmd=get_result msg=success\n").unwrap();
        assert_eq!(m.cmd, "get_result");
        assert_eq!(m.get("value"), Some("abc"));
        assert_eq!(m.rc(), Ok(0));
        let m = Message::parse("cmd=get_result rc=-1 msg=key not found\r\n").unwrap();
        assert_eq!(m.get("msg"), Some("key not found"));
        assert_eq!(m.rc(), Ok(-1));
        let m = Message::parse("cmd=put_result value=").unwrap();
        assert_eq!(m.get("value"), Some(""));
    }

    #[test]
    fn parse_rejects_garbage_fails() {
        for bad in ["", "\n", "hello", "=x cmd=a", "key=v", "cmd=", "mcmd=spawn"] {
            assert!(Message::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Message::parse("cmd=x rc=zz").unwrap().rc().is_err());
    }

    #[test]
    fn v2_frames_round_trip_and_escapes_are_read() {
        let m = Message::new("kvs-put").with("key", "a").with("value", "x:1,y");
        let f = m.to_v2();
        assert_eq!(f, "30    cmd=kvs-put;key=a;value=x:1,y;");
        assert_eq!(&f[..V2_LEN_FIELD].trim().parse::<usize>().unwrap(), &(f.len() - V2_LEN_FIELD));
        assert_eq!(Message::parse_v2(&f[V2_LEN_FIELD..]).unwrap(), m);
        let m = Message::parse_v2("rc=0;cmd=kvs-get-response;found=TRUE;value=a;;b;").unwrap();
        assert_eq!((m.cmd.as_str(), m.get("value")), ("kvs-get-response", Some("a;b")));
        for bad in ["", "rc=0;", "cmd=;", "cmd=x;novalue;", "cmd=x;=v;"] {
            assert!(Message::parse_v2(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn round_trip_works() {
        let m = Message::new("put")
            .with("kvsname", "k")
            .with("key", "a")
            .with("value", 5);
        assert_eq!(m.to_line(), "cmd=put kvsname=k key=a value=5\n");
        assert_eq!(Message::parse(&m.to_line()).unwrap(), m);
    }

    #[test]
    fn check_token_works() {
        assert!(check_token("abc-1_2:3", 16, false).is_ok());
        assert!(check_token("", 16, true).is_ok());
        assert!(check_token("", 16, false).is_err());
        assert!(check_token("a b", 16, false).is_err());
        assert!(check_token("a=b", 16, false).is_err());
        assert!(check_token("a\nb", 16, false).is_err());
        assert!(check_token("abcdef", 5, false).is_err());
        assert_eq!(sanitize("a b=c\n"), "a_b_c_");
        assert_eq!(sanitize_text("a b=c\n"), "a_b=c_");
        let m = Message::parse(
            &Message::new("r")
                .with("msg", sanitize_text("x= y"))
                .to_line(),
        )
        .unwrap();
        assert_eq!(m.get("msg"), Some("x=_y"));
    }
}
