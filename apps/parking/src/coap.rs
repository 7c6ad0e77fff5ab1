//! A CoAP client for the cameras (RFC 7252 over UDP, messages by `coap-lite`): a confirmable
//! POST whose body goes block-wise (RFC 7959 Block1) when it is larger than one block, as a
//! 3 KB snapshot is.
//!
//! Each [`CoapClient`] owns one UDP socket and runs one request at a time, so its answers
//! never mix with another request's. Per block: a CON message, retransmitted after 2 s and
//! then twice as long each time, at most 4 times (RFC 7252's ACK_TIMEOUT, MAX_RETRANSMIT;
//! no random factor); every block but the last must be answered 2.31 Continue. The last
//! one's answer is the response, piggy-backed on the ACK, or, after an empty ACK (the chain
//! took longer than the gateway waits), a separate response that is acknowledged here.

use std::net::SocketAddr;
use std::time::Duration;

use coap_lite::{CoapOption, MessageClass, MessageType, Packet, RequestType};
use tokio::net::UdpSocket;
use tokio::time::Instant;

/// First retransmission timeout.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// Retransmissions of one message at most.
const MAX_RETRANSMIT: u32 = 4;
/// Largest datagram read.
const MAX_DATAGRAM: usize = 2048;
/// 2.31 Continue.
const CONTINUE: u8 = (2 << 5) | 31;

/// What can go wrong with a request.
#[derive(Debug, thiserror::Error)]
pub enum CoapError {
    /// The socket failed.
    #[error("CoAP socket: {0}")]
    Io(#[from] std::io::Error),
    /// No acknowledgement after every retransmission, or no response by the deadline.
    #[error("no CoAP answer {0}")]
    Timeout(&'static str),
    /// The server reset the exchange.
    #[error("CoAP reset by the server")]
    Reset,
    /// A block was not answered 2.31 Continue.
    #[error("block {block} answered {code} instead of 2.31: {text}")]
    BlockRefused {
        /// The block's number.
        block: usize,
        /// The answer's code (`4.08`).
        code: String,
        /// Its diagnostic payload.
        text: String,
    },
    /// A message could not be written (an option too long).
    #[error("cannot encode the CoAP message: {0}")]
    Encode(String),
}

/// A response: its code (class, detail) and payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoapResponse {
    /// Class (2 success, 4 client error, 5 server error).
    pub class: u8,
    /// Detail (`4` of 2.04).
    pub detail: u8,
    /// The payload.
    pub payload: Vec<u8>,
}

impl CoapResponse {
    /// Whether the code is 2.xx.
    pub fn is_success(&self) -> bool {
        self.class == 2
    }

    /// The code as `c.dd`.
    pub fn code(&self) -> String {
        format!("{}.{:02}", self.class, self.detail)
    }
}

/// A CoAP client on a UDP socket of its own.
pub struct CoapClient {
    sock: UdpSocket,
    next_mid: u16,
    next_token: u32,
    block: usize,
}

impl CoapClient {
    /// A client of the server at `server`, sending bodies in blocks of `block` bytes (a
    /// power of two, 16 to 1024).
    pub async fn connect(server: SocketAddr, block: usize) -> Result<Self, CoapError> {
        assert!(
            block.is_power_of_two() && (16..=1024).contains(&block),
            "block size {block} is not a power of two from 16 to 1024"
        );
        let local: SocketAddr = if server.is_ipv4() {
            "0.0.0.0:0".parse().expect("address")
        } else {
            "[::]:0".parse().expect("address")
        };
        let sock = UdpSocket::bind(local).await?;
        sock.connect(server).await?;
        // Different clients start their message ids and tokens apart.
        let port = sock.local_addr()?.port();
        Ok(Self {
            sock,
            next_mid: port.wrapping_mul(31),
            next_token: u32::from(port) << 16,
            block,
        })
    }

    /// POSTs `body` to `path` (`/snapshot`), block-wise when it is larger than a block; gives
    /// up at `deadline`.
    pub async fn post(
        &mut self,
        path: &str,
        body: &[u8],
        deadline: Instant,
    ) -> Result<CoapResponse, CoapError> {
        self.next_token = self.next_token.wrapping_add(1);
        let token = self.next_token.to_be_bytes().to_vec();
        let blocks = body.len().div_ceil(self.block).max(1);
        let szx = self.block.trailing_zeros() - 4;
        for (num, chunk) in body
            .chunks(self.block)
            .chain(body.is_empty().then_some(&[][..]))
            .enumerate()
        {
            let more = num + 1 < blocks;
            let mut p = Packet::new();
            p.header.set_type(MessageType::Confirmable);
            p.header.code = MessageClass::Request(RequestType::Post);
            p.set_token(token.clone());
            for segment in path.split('/').filter(|s| !s.is_empty()) {
                p.add_option(CoapOption::UriPath, segment.as_bytes().to_vec());
            }
            if blocks > 1 {
                let value = ((num as u32) << 4) | (u32::from(more) << 3) | szx;
                p.add_option(CoapOption::Block1, uint_option(value));
                if num == 0 {
                    p.add_option(CoapOption::Size1, uint_option(body.len() as u32));
                }
            }
            p.payload = chunk.to_vec();
            let answer = self.exchange(p, deadline).await?;
            let code = u8::from(answer.header.code);
            if more {
                if code != CONTINUE {
                    let r = response_of(&answer);
                    return Err(CoapError::BlockRefused {
                        block: num,
                        code: r.code(),
                        text: String::from_utf8_lossy(&r.payload).into_owned(),
                    });
                }
                continue;
            }
            if code != 0 {
                return Ok(response_of(&answer));
            }
            // An empty ACK: the response comes separately.
            return self.separate_response(&token, deadline).await;
        }
        unreachable!("at least one block is sent")
    }

    /// Sends `p` as a CON with a new message id until its ACK (or RST) comes.
    async fn exchange(&mut self, mut p: Packet, deadline: Instant) -> Result<Packet, CoapError> {
        self.next_mid = self.next_mid.wrapping_add(1);
        let mid = self.next_mid;
        p.header.message_id = mid;
        let bytes = p
            .to_bytes()
            .map_err(|e| CoapError::Encode(format!("{e:?}")))?;
        let mut wait = ACK_TIMEOUT;
        let mut buf = vec![0; MAX_DATAGRAM];
        for _ in 0..=MAX_RETRANSMIT {
            self.sock.send(&bytes).await?;
            let until = (Instant::now() + wait).min(deadline);
            loop {
                let n = match tokio::time::timeout_at(until, self.sock.recv(&mut buf)).await {
                    Ok(r) => r?,
                    Err(_) => break,
                };
                let Ok(answer) = Packet::from_bytes(&buf[..n]) else {
                    continue;
                };
                if answer.header.message_id != mid {
                    continue; // a late answer to an earlier message
                }
                match answer.header.get_type() {
                    MessageType::Acknowledgement => return Ok(answer),
                    MessageType::Reset => return Err(CoapError::Reset),
                    _ => continue,
                }
            }
            if Instant::now() >= deadline {
                return Err(CoapError::Timeout("before the deadline"));
            }
            wait *= 2;
        }
        Err(CoapError::Timeout("after 4 retransmissions"))
    }

    /// Waits for the separate response carrying `token`; acknowledges it when it is a CON.
    async fn separate_response(
        &mut self,
        token: &[u8],
        deadline: Instant,
    ) -> Result<CoapResponse, CoapError> {
        let mut buf = vec![0; MAX_DATAGRAM];
        loop {
            let n = tokio::time::timeout_at(deadline, self.sock.recv(&mut buf))
                .await
                .map_err(|_| CoapError::Timeout("(separate response) before the deadline"))??;
            let Ok(answer) = Packet::from_bytes(&buf[..n]) else {
                continue;
            };
            if answer.get_token() != token || u8::from(answer.header.code) == 0 {
                continue;
            }
            if answer.header.get_type() == MessageType::Confirmable {
                let mut ack = Packet::new();
                ack.header.set_type(MessageType::Acknowledgement);
                ack.header.code = MessageClass::Empty;
                ack.header.message_id = answer.header.message_id;
                if let Ok(bytes) = ack.to_bytes() {
                    self.sock.send(&bytes).await?;
                }
            }
            return Ok(response_of(&answer));
        }
    }
}

/// An unsigned option value in the fewest bytes (zero: none), big-endian.
fn uint_option(v: u32) -> Vec<u8> {
    let bytes = v.to_be_bytes();
    let skip = bytes.iter().take_while(|&&b| b == 0).count();
    bytes[skip..].to_vec()
}

fn response_of(p: &Packet) -> CoapResponse {
    let code = u8::from(p.header.code);
    CoapResponse {
        class: code >> 5,
        detail: code & 0x1f,
        payload: p.payload.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uint_options_use_the_fewest_bytes() {
        assert_eq!(uint_option(0), Vec::<u8>::new());
        assert_eq!(uint_option(0x0e), vec![0x0e]);
        assert_eq!(uint_option(3072), vec![0x0c, 0x00]);
        assert_eq!(uint_option(0x01_02_03), vec![1, 2, 3]);
    }

    /// A server that answers 2.31 to every block but the last, then sends an empty ACK and a
    /// separate CON response; the client must reassemble nothing and acknowledge it.
    #[test]
    fn block_wise_post_with_a_separate_response() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let addr = server.local_addr().unwrap();
            let serve = tokio::spawn(async move {
                let mut buf = vec![0; 2048];
                let mut body = Vec::new();
                loop {
                    let (n, peer) = server.recv_from(&mut buf).await.unwrap();
                    let req = Packet::from_bytes(&buf[..n]).unwrap();
                    let block = req.get_first_option(CoapOption::Block1).cloned().unwrap();
                    let v = block.iter().fold(0u32, |a, &b| (a << 8) | u32::from(b));
                    body.extend_from_slice(&req.payload);
                    let mut ack = Packet::new();
                    ack.header.set_type(MessageType::Acknowledgement);
                    ack.header.message_id = req.header.message_id;
                    ack.set_token(req.get_token().to_vec());
                    if v & 8 != 0 {
                        ack.header.code = MessageClass::from(CONTINUE);
                        server
                            .send_to(&ack.to_bytes().unwrap(), peer)
                            .await
                            .unwrap();
                        continue;
                    }
                    ack.header.code = MessageClass::Empty;
                    ack.set_token(vec![]);
                    server
                        .send_to(&ack.to_bytes().unwrap(), peer)
                        .await
                        .unwrap();
                    let mut sep = Packet::new();
                    sep.header.set_type(MessageType::Confirmable);
                    sep.header.message_id = 999;
                    sep.header.code = MessageClass::from((2 << 5) | 4);
                    sep.set_token(req.get_token().to_vec());
                    sep.payload = format!("got {}", body.len()).into_bytes();
                    server
                        .send_to(&sep.to_bytes().unwrap(), peer)
                        .await
                        .unwrap();
                    let (n, _) = server.recv_from(&mut buf).await.unwrap();
                    let ack = Packet::from_bytes(&buf[..n]).unwrap();
                    assert_eq!(ack.header.get_type(), MessageType::Acknowledgement);
                    assert_eq!(ack.header.message_id, 999);
                    return body;
                }
            });
            let mut client = CoapClient::connect(addr, 1024).await.unwrap();
            let body: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
            let deadline = Instant::now() + Duration::from_secs(10);
            let r = client.post("/snapshot", &body, deadline).await.unwrap();
            assert_eq!(r.code(), "2.04");
            assert_eq!(r.payload, b"got 3000");
            assert_eq!(serve.await.unwrap(), body);
        });
    }
}
