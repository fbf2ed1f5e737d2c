//! A gRPC peer that speaks raw HTTP/2 (h2c), to send the answers no gRPC
//! library would: an OK status without a message, two messages for a unary
//! call, a length prefix longer than its message, a message over gRPC's
//! 4 MiB limit. What a proxy in front of ateapi (B108) or of an OTLP
//! collector (B133) could send.
//!
//! Each connection is served by one thread. Requests are not decoded (their
//! HPACK is ignored); every request stream that ends gets the next answer of
//! the script, or the default answer once the script is empty. Responses use
//! HPACK literals without indexing, so they need no dynamic table, and DATA
//! respects the router's flow-control windows.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use atenet_router::proto::ateapi::{Actor, ActorStatus, ResumeActorResponse, WorkerAssignment};
use parking_lot::Mutex;
use protobuf::{Message, MessageField};

/// One answer to one unary call.
#[derive(Clone, Debug)]
pub enum Answer {
    /// A valid answer: this message, status OK.
    Message(Vec<u8>),
    /// A status alone (trailers-only), with this code and message.
    Status(u32, &'static str),
    /// Trailers-only with status OK: no message.
    OkWithoutMessage,
    /// Headers, then trailers with status OK, no DATA in between.
    HeadersThenOk,
    /// A length prefix of 100 bytes and 10 bytes of message, then OK.
    ShortMessage,
    /// The message twice, then OK.
    TwoMessages(Vec<u8>),
    /// A valid message of this many bytes (one unknown field), then OK.
    Big(usize),
}

/// A control plane's valid answer: the actor runs on 10.0.0.7.
pub fn running() -> Vec<u8> {
    let mut assignment = WorkerAssignment::new();
    assignment.worker_pod_ips = vec!["10.0.0.7".into()];
    let mut status = ActorStatus::new();
    status.worker_assignment = MessageField::some(assignment);
    let mut actor = Actor::new();
    actor.status = MessageField::some(status);
    let mut response = ResumeActorResponse::new();
    response.actor = MessageField::some(actor);
    response.write_to_bytes().unwrap()
}

/// The scripted peer.
pub struct H2Peer {
    pub addr: SocketAddr,
    script: Arc<Mutex<VecDeque<Answer>>>,
    default: Arc<Mutex<Answer>>,
    /// Request streams that ended (calls received).
    calls: Arc<AtomicUsize>,
}

impl H2Peer {
    /// Listens on a free loopback port; `default` answers whatever the
    /// script does not.
    pub fn start(default: Answer) -> H2Peer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = H2Peer {
            addr: listener.local_addr().unwrap(),
            script: Arc::default(),
            default: Arc::new(Mutex::new(default)),
            calls: Arc::default(),
        };
        let (script, default, calls) = (peer.script.clone(), peer.default.clone(), peer.calls.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let mut connection = Connection {
                    stream,
                    script: script.clone(),
                    default: default.clone(),
                    calls: calls.clone(),
                    resets: 0,
                    window: 65_535,
                    initial_stream_window: 65_535,
                    stream_windows: HashMap::new(),
                };
                std::thread::spawn(move || {
                    let _ = connection.serve();
                });
            }
        });
        peer
    }

    /// Answers the next calls with `answers`, in order.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.script.lock().extend(answers);
    }

    pub fn set_default(&self, answer: Answer) {
        *self.default.lock() = answer;
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;
const ACK: u8 = 1;
/// HTTP/2's default SETTINGS_MAX_FRAME_SIZE, which the router never raises
/// for what it receives.
const MAX_FRAME: usize = 16_384;

struct Connection {
    stream: TcpStream,
    script: Arc<Mutex<VecDeque<Answer>>>,
    default: Arc<Mutex<Answer>>,
    calls: Arc<AtomicUsize>,
    /// RST_STREAM frames received: a reset stream is sent no more DATA.
    resets: usize,
    /// What the router lets this side send, on the connection and per stream.
    window: i64,
    initial_stream_window: i64,
    stream_windows: HashMap<u32, i64>,
}

struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl Connection {
    fn serve(&mut self) -> std::io::Result<()> {
        let mut preface = [0u8; 24];
        self.stream.read_exact(&mut preface)?;
        self.write_frame(SETTINGS, 0, 0, &[])?;
        loop {
            let frame = self.read_frame()?;
            if let Some(stream) = self.handle(&frame)? {
                self.calls.fetch_add(1, Ordering::SeqCst);
                let answer = self.script.lock().pop_front().unwrap_or_else(|| self.default.lock().clone());
                self.answer(stream, answer)?;
            }
        }
    }

    /// Handles a frame; returns the stream whose request just ended.
    fn handle(&mut self, frame: &Frame) -> std::io::Result<Option<u32>> {
        match frame.kind {
            SETTINGS if frame.flags & ACK == 0 => {
                for setting in frame.payload.chunks_exact(6) {
                    let (id, value) = (u16::from_be_bytes([setting[0], setting[1]]), be32(&setting[2..]));
                    if id == 4 {
                        // SETTINGS_INITIAL_WINDOW_SIZE: applies to every
                        // stream, open ones included, as a difference.
                        let delta = i64::from(value) - self.initial_stream_window;
                        self.initial_stream_window = i64::from(value);
                        self.stream_windows.values_mut().for_each(|w| *w += delta);
                    }
                }
                self.write_frame(SETTINGS, ACK, 0, &[])?;
            }
            PING if frame.flags & ACK == 0 => self.write_frame(PING, ACK, 0, &frame.payload)?,
            WINDOW_UPDATE => {
                let increment = i64::from(be32(&frame.payload) & 0x7fff_ffff);
                match frame.stream {
                    0 => self.window += increment,
                    stream => {
                        *self.stream_windows.entry(stream).or_insert(self.initial_stream_window) += increment
                    }
                }
            }
            RST_STREAM => self.resets += 1,
            GOAWAY => return Err(std::io::ErrorKind::ConnectionAborted.into()),
            HEADERS | DATA => {
                self.stream_windows.entry(frame.stream).or_insert(self.initial_stream_window);
                if frame.flags & END_STREAM != 0 {
                    return Ok(Some(frame.stream));
                }
            }
            _ => {}
        }
        Ok(None)
    }

    fn answer(&mut self, stream: u32, answer: Answer) -> std::io::Result<()> {
        let headers = hpack(&[(":status", "200"), ("content-type", "application/grpc")]);
        let ok = hpack(&[("grpc-status", "0")]);
        match answer {
            Answer::Status(code, message) => {
                let code = code.to_string();
                let block = hpack(&[
                    (":status", "200"),
                    ("content-type", "application/grpc"),
                    ("grpc-status", &code),
                    ("grpc-message", message),
                ]);
                self.write_frame(HEADERS, END_HEADERS | END_STREAM, stream, &block)
            }
            Answer::OkWithoutMessage => {
                let block =
                    hpack(&[(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "0")]);
                self.write_frame(HEADERS, END_HEADERS | END_STREAM, stream, &block)
            }
            Answer::HeadersThenOk => {
                self.write_frame(HEADERS, END_HEADERS, stream, &headers)?;
                self.write_frame(HEADERS, END_HEADERS | END_STREAM, stream, &ok)
            }
            Answer::ShortMessage => {
                self.write_frame(HEADERS, END_HEADERS, stream, &headers)?;
                let mut data = vec![0, 0, 0, 0, 100];
                data.extend([0u8; 10]);
                self.send_data(stream, &data)?;
                self.write_frame(HEADERS, END_HEADERS | END_STREAM, stream, &ok)
            }
            Answer::Message(message) => {
                self.write_frame(HEADERS, END_HEADERS, stream, &headers)?;
                self.send_data(stream, &grpc_message(&message))?;
                self.write_frame(HEADERS, END_HEADERS | END_STREAM, stream, &ok)
            }
            Answer::TwoMessages(message) => {
                self.write_frame(HEADERS, END_HEADERS, stream, &headers)?;
                let mut data = grpc_message(&message);
                data.extend(grpc_message(&message));
                self.send_data(stream, &data)?;
                self.write_frame(HEADERS, END_HEADERS | END_STREAM, stream, &ok)
            }
            Answer::Big(len) => {
                self.write_frame(HEADERS, END_HEADERS, stream, &headers)?;
                self.send_data(stream, &grpc_message(&big_message(len)))?;
                self.write_frame(HEADERS, END_HEADERS | END_STREAM, stream, &ok)
            }
        }
    }

    /// Sends `data` on `stream` within the flow-control windows, reading
    /// the router's frames while a window is closed. A stream the router
    /// resets is given up.
    fn send_data(&mut self, stream: u32, mut data: &[u8]) -> std::io::Result<()> {
        let resets = self.resets;
        while !data.is_empty() {
            let stream_window =
                self.stream_windows.get(&stream).copied().unwrap_or(self.initial_stream_window);
            let room = self.window.min(stream_window).min(MAX_FRAME as i64);
            if room <= 0 {
                let frame = self.read_frame()?;
                self.handle(&frame)?;
                if self.resets != resets {
                    return Ok(());
                }
                continue;
            }
            let (chunk, rest) = data.split_at(data.len().min(room as usize));
            self.write_frame(DATA, 0, stream, chunk)?;
            self.window -= chunk.len() as i64;
            *self.stream_windows.entry(stream).or_insert(self.initial_stream_window) -= chunk.len() as i64;
            data = rest;
        }
        Ok(())
    }

    fn read_frame(&mut self) -> std::io::Result<Frame> {
        let mut header = [0u8; 9];
        self.stream.read_exact(&mut header)?;
        let len = (usize::from(header[0]) << 16) | (usize::from(header[1]) << 8) | usize::from(header[2]);
        let mut payload = vec![0u8; len];
        self.stream.read_exact(&mut payload)?;
        Ok(Frame { kind: header[3], flags: header[4], stream: be32(&header[5..]) & 0x7fff_ffff, payload })
    }

    fn write_frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> std::io::Result<()> {
        let len = payload.len();
        let mut frame = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        frame.extend(stream.to_be_bytes());
        frame.extend(payload);
        self.stream.write_all(&frame)
    }
}

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// A header block of literals without indexing (RFC 7541 6.2.2), lengths
/// as 7-bit-prefix integers, no Huffman.
fn hpack(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in headers {
        block.push(0);
        for text in [name, value] {
            integer(&mut block, text.len());
            block.extend(text.as_bytes());
        }
    }
    block
}

fn integer(out: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        return out.push(n as u8);
    }
    out.push(127);
    n -= 127;
    while n >= 128 {
        out.push((n % 128 + 128) as u8);
        n /= 128;
    }
    out.push(n as u8);
}

/// A gRPC length-prefixed message, uncompressed.
fn grpc_message(message: &[u8]) -> Vec<u8> {
    let mut data = vec![0];
    data.extend((message.len() as u32).to_be_bytes());
    data.extend(message);
    data
}

/// A valid protobuf message of `len` bytes: one unknown length-delimited
/// field (number 15), which a parser skips.
fn big_message(len: usize) -> Vec<u8> {
    let mut message = vec![(15 << 3) | 2];
    let mut prefix = Vec::new();
    let mut body_len = len - 1 - 5;
    // A 5-byte varint length, so the total is exactly `len`.
    for _ in 0..4 {
        prefix.push((body_len & 0x7f) as u8 | 0x80);
        body_len >>= 7;
    }
    prefix.push(body_len as u8);
    message.extend(prefix);
    message.resize(len, b'x');
    message
}
