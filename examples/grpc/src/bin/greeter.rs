//! `greeter`: `zerohop.example.Greeter/SayHello` of `greeter.proto`. The gateway hands it the
//! request message's bytes (the gRPC frame stripped) and sends its output back as the
//! answer message; an error's status becomes the call's `grpc-status` (400 is
//! INVALID_ARGUMENT, 404 NOT_FOUND; the table is in docs/spec.md).
//!
//! The two messages have only string fields, so the protobuf wire format is read and
//! written here by hand (a real service would use prost or another generator).

#![forbid(unsafe_code)]

use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    run(|req: &mut Request<'_>| {
        let (name, language) = hello_request(req.body()).map_err(HandlerError::bad_request)?;
        if name.is_empty() {
            return Err(HandlerError::bad_request("name is empty"));
        }
        let greeting = match language.as_str() {
            "" | "en" => "Hello",
            "fr" => "Bonjour",
            "de" => "Hallo",
            "es" => "Hola",
            other => {
                return Err(HandlerError::not_found(format!(
                    "no greeting in language `{other}`"
                )))
            }
        };
        req.set_body(&hello_reply(&format!("{greeting}, {name}!")))?;
        Ok(Next::Continue)
    })
}

/// `HelloRequest { name = 1, language = 2 }`; unknown fields are skipped, as protobuf says.
fn hello_request(mut b: &[u8]) -> Result<(String, String), String> {
    let (mut name, mut language) = (String::new(), String::new());
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let len = match key & 7 {
            0 => {
                varint(&mut b)?;
                0
            }
            1 => 8,
            2 => usize::try_from(varint(&mut b)?).map_err(|_| "a length too large")?,
            5 => 4,
            w => return Err(format!("wire type {w} is not supported")),
        };
        if len > b.len() {
            return Err("a field runs past the message".into());
        }
        let (value, rest) = b.split_at(len);
        b = rest;
        if key & 7 == 2 && (key >> 3 == 1 || key >> 3 == 2) {
            let text = std::str::from_utf8(value)
                .map_err(|_| "a string field is not UTF-8")?
                .to_owned();
            if key >> 3 == 1 {
                name = text;
            } else {
                language = text;
            }
        }
    }
    Ok((name, language))
}

/// A base-128 varint, at most 10 bytes.
fn varint(b: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&byte, rest) = b.split_first().ok_or("the message ends inside a varint")?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a varint longer than 10 bytes".into())
}

/// `HelloReply { message = 1 }`.
fn hello_reply(message: &str) -> Vec<u8> {
    let mut out = vec![0x0a];
    let mut n = message.len();
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(message.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_the_protobuf_wire_format() {
        // name "Ada", an unknown varint field 3, language "fr".
        let req = b"\x0a\x03Ada\x18\x96\x01\x12\x02fr";
        assert_eq!(hello_request(req).unwrap(), ("Ada".into(), "fr".into()));
        assert_eq!(hello_request(b"").unwrap(), (String::new(), String::new()));
        assert!(hello_request(b"\x0a\x05Ad").is_err());
        assert_eq!(hello_reply("hi"), b"\x0a\x02hi");
        let long = "x".repeat(300);
        assert_eq!(&hello_reply(&long)[..3], b"\x0a\xac\x02");
    }
}
