//! `ateapi-sim`: a simulated control plane serving `/ateapi.Control/ResumeActor`
//! over real gRPC.
//!
//! Two modes share one server:
//! - **Pool model**: `actors` actors (`<atespace>/actor-0`, ...) share
//!   `workers` workers. Resuming a suspended actor claims a free worker and
//!   answers after the restore latency; with no free worker it answers
//!   ResourceExhausted `no free workers available`; a resume while another is
//!   running for the same actor answers Aborted. An actor is suspended, and
//!   its worker freed, `idle_suspend` after its last resume. Faults can be
//!   injected: a rate of Unavailable, a rate of Aborted, and a periodic outage
//!   window that answers Unavailable, like a rolling restart.
//! - **Scripted**: a test gives an actor a sequence of answers (code, message,
//!   delay, worker IPs, resumed); each call takes the next one, and the last
//!   repeats. Calls are counted per actor and can be awaited.
//!
//! Delayed answers are futures woken by the sim's timer thread, so a slow
//! restore holds no thread.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::channel::oneshot;
use grpcio::{
    CertificateRequestType, ChannelBuilder, EnvBuilder, RpcContext, RpcStatus, RpcStatusCode, Server,
    ServerBuilder, ServerCredentials, ServerCredentialsBuilder, ServiceBuilder, UnarySink,
};
use parking_lot::{Condvar, Mutex};
use protobuf::MessageField;

use crate::actor::resume::Code;
use crate::parking::timer::{sleep_until, Scheduler, TimerThread};
use crate::proto::ateapi::{
    Actor, ActorState, ActorStatus, ResourceMetadata, ResumeActorRequest, ResumeActorResponse,
    WorkerAssignment,
};
use crate::proto::ATEAPI_RESUME_ACTOR;
use crate::telemetry::logging::json_string;

/// The pool model's parameters.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub listen: SocketAddr,
    pub workers: usize,
    pub actors: usize,
    pub atespace: String,
    pub restore_latency: Duration,
    /// Restore latency varies by up to this fraction either way.
    pub restore_jitter: f64,
    pub idle_suspend: Duration,
    /// Fraction of calls answered Unavailable.
    pub unavailable_rate: f64,
    /// Fraction of calls answered Aborted.
    pub aborted_rate: f64,
    /// Every `outage_every`, answer Unavailable for `outage_for` (zero disables).
    pub outage_every: Duration,
    pub outage_for: Duration,
    /// Fraction of restores that take `slow_restore` instead (beyond a
    /// router's budget, say).
    pub slow_restore_rate: f64,
    pub slow_restore: Duration,
    /// Serve TLS (and require client certificates when `client_ca` is set).
    pub tls: Option<SimTls>,
    /// The workers' addresses.
    pub worker_ips: WorkerIps,
}

/// Where the simulated workers are, as the IPs ResumeActor hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerIps {
    /// Every worker has this IP, so that routed requests reach a real
    /// worker (one echo server stands in for the pool).
    Shared(IpAddr),
    /// Worker `i` has the `(i + 1)`-th host address of this IPv4 network,
    /// so that a test can tell which worker a request reached (an echo
    /// server bound to each address of a loopback network, say).
    Network(Ipv4Net),
}

impl WorkerIps {
    /// A distinct address per worker in 10.64.0.0/10, reachable nowhere:
    /// room for [`Ipv4Net::hosts`] = 4,194,302 workers.
    pub const UNREACHABLE: WorkerIps =
        WorkerIps::Network(Ipv4Net { base: Ipv4Addr::new(10, 64, 0, 0), prefix: 10 });

    /// Worker `worker`'s IP (`worker` below the pool size, which
    /// [`Ipv4Net::hosts`] bounds).
    pub fn of(self, worker: usize) -> IpAddr {
        match self {
            WorkerIps::Shared(ip) => ip,
            WorkerIps::Network(net) => {
                IpAddr::V4(Ipv4Addr::from(u32::from(net.base).wrapping_add(worker as u32 + 1)))
            }
        }
    }
}

/// An IPv4 network, `a.b.c.d/prefix`, its base address normalised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Net {
    base: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Net {
    /// Parses `a.b.c.d/prefix` with a prefix of 8 to 30 (a smaller one is
    /// not a network a test means; a larger one holds no two workers).
    pub fn parse(text: &str) -> Result<Ipv4Net, String> {
        let bad = || format!("expected an IPv4 network a.b.c.d/8..30, got {text:?}");
        let (ip, prefix) = text.split_once('/').ok_or_else(bad)?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        if !(8..=30).contains(&prefix) {
            return Err(bad());
        }
        let mask = u32::MAX << (32 - prefix);
        Ok(Ipv4Net { base: Ipv4Addr::from(u32::from(ip) & mask), prefix })
    }

    /// Host addresses: all but the network and broadcast addresses.
    pub fn hosts(self) -> usize {
        (1usize << (32 - self.prefix)) - 2
    }
}

/// The sim's TLS identity, PEM-encoded.
#[derive(Clone, Debug)]
pub struct SimTls {
    pub cert_chain: Vec<u8>,
    pub key: Vec<u8>,
    /// When set, clients must present a certificate this CA signed.
    pub client_ca: Option<Vec<u8>>,
}

/// Faults the pool model injected, for soak reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    pub unavailable: u64,
    pub outage: u64,
    pub aborted: u64,
    pub exhausted: u64,
    pub not_found: u64,
    pub slow_restores: u64,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 50061)),
            workers: 4,
            actors: 64,
            atespace: "demo".into(),
            restore_latency: Duration::from_millis(300),
            restore_jitter: 0.2,
            idle_suspend: Duration::from_secs(30),
            unavailable_rate: 0.0,
            aborted_rate: 0.0,
            outage_every: Duration::ZERO,
            outage_for: Duration::ZERO,
            slow_restore_rate: 0.0,
            slow_restore: Duration::from_secs(10),
            tls: None,
            worker_ips: WorkerIps::UNREACHABLE,
        }
    }
}

/// One scripted answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub code: Code,
    pub message: String,
    pub delay: Duration,
    pub ips: Vec<String>,
    pub resumed: bool,
    /// Held until [`Sim::release`] is called for the actor.
    pub held: bool,
}

impl Answer {
    /// Success with one worker IP.
    pub fn ok(ip: &str, resumed: bool) -> Answer {
        Answer {
            code: Code::Ok,
            message: String::new(),
            delay: Duration::ZERO,
            ips: vec![ip.into()],
            resumed,
            held: false,
        }
    }

    /// A gRPC error.
    pub fn error(code: Code, message: &str) -> Answer {
        Answer {
            code,
            message: message.into(),
            delay: Duration::ZERO,
            ips: Vec::new(),
            resumed: false,
            held: false,
        }
    }

    /// The same answer, held until the test calls [`Sim::release`].
    pub fn held(mut self) -> Answer {
        self.held = true;
        self
    }

    /// The same answer, given after `delay`.
    pub fn after(mut self, delay: Duration) -> Answer {
        self.delay = delay;
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ActorSim {
    Suspended,
    Resuming,
    Running { worker: usize, last_resume: Instant },
}

struct PoolState {
    actors: HashMap<String, ActorSim>,
    free: Vec<usize>,
    /// Workers in the pool, free or not: the next added one's number.
    workers: usize,
    /// No running actor goes idle before this (`None`: none ever will), so
    /// a call looks through every actor only when one may have: with
    /// 100,000 actors, a sweep on every call would make the simulator, not
    /// the router, the bottleneck of a benchmark.
    next_sweep: Option<Instant>,
}

struct State {
    config: SimConfig,
    started: Instant,
    pool: Mutex<PoolState>,
    scripts: Mutex<HashMap<String, VecDeque<Answer>>>,
    calls: Mutex<HashMap<String, u64>>,
    calls_changed: Condvar,
    /// Answers sent, by actor and code.
    answered: Mutex<HashMap<(String, Code), Answered>>,
    gates: Mutex<HashMap<String, Vec<oneshot::Sender<()>>>>,
    /// While set, every call is accepted and held, unanswered, until
    /// [`Sim::set_unresponsive`] clears it: a control plane that hangs.
    unresponsive: Mutex<Option<Vec<oneshot::Sender<()>>>>,
    timer: Arc<TimerThread>,
    faults: Mutex<Faults>,
    /// The `authorization` header of the latest call.
    last_authorization: Mutex<Option<String>>,
    /// Where every answer and suspension is written, when set.
    answer_log: Mutex<Option<std::fs::File>>,
}

/// Answers sent to one actor with one code.
struct Answered {
    count: u64,
    /// When the first was sent.
    first: Instant,
}

/// Why the simulator could not start.
#[derive(Debug)]
pub enum SimError {
    Build(grpcio::Error),
    Listen { addr: SocketAddr, source: grpcio::Error },
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::Build(e) => write!(f, "building the sim server: {e}"),
            SimError::Listen { addr, source } => write!(f, "cannot listen on {addr}: {source}"),
        }
    }
}

impl std::error::Error for SimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SimError::Build(e) | SimError::Listen { source: e, .. } => Some(e),
        }
    }
}

/// A script line that is not one (see [`parse_script`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptError {
    /// 1-based.
    pub line: usize,
    pub text: String,
    pub reason: String,
}

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "script line {}: {}: {:?}", self.line, self.reason, self.text)
    }
}

impl std::error::Error for ScriptError {}

/// A running simulated control plane.
pub struct Sim {
    state: Arc<State>,
    server: Server,
    addr: SocketAddr,
}

impl Sim {
    /// Binds `config.listen` and starts serving.
    pub fn start(config: SimConfig) -> Result<Sim, SimError> {
        let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("ateapi-sim").build());
        let state = Arc::new(State::new(config));
        let handler_state = Arc::clone(&state);
        let service = ServiceBuilder::new()
            .add_unary_handler(
                &ATEAPI_RESUME_ACTOR,
                move |ctx: RpcContext<'_>,
                      request: ResumeActorRequest,
                      sink: UnarySink<ResumeActorResponse>| {
                    let state = Arc::clone(&handler_state);
                    let authorization = ctx
                        .request_headers()
                        .iter()
                        .find(|(key, _)| key.eq_ignore_ascii_case("authorization"))
                        .map(|(_, value)| String::from_utf8_lossy(value).into_owned());
                    *state.last_authorization.lock() = authorization;
                    // Logged with the answer, so that a test sees which trace
                    // each call continued (B122).
                    let traceparent = ctx
                        .request_headers()
                        .iter()
                        .find(|(key, _)| key.eq_ignore_ascii_case("traceparent"))
                        .map(|(_, value)| String::from_utf8_lossy(value).into_owned());
                    let (id, answer, after) = state.answer(&request);
                    let deadline = Instant::now() + answer.delay;
                    let scheduler: Arc<dyn Scheduler> = state.timer.clone();
                    let gate = answer.held.then(|| {
                        let (open, wait) = oneshot::channel();
                        state.gates.lock().entry(id.clone()).or_default().push(open);
                        wait
                    });
                    let hang = state.unresponsive.lock().as_mut().map(|held| {
                        let (open, wait) = oneshot::channel();
                        held.push(open);
                        wait
                    });
                    ctx.spawn(async move {
                        if let Some(hang) = hang {
                            let _ = hang.await;
                        }
                        if let Some(gate) = gate {
                            let _ = gate.await;
                        }
                        if !answer.delay.is_zero() {
                            sleep_until(scheduler, deadline).await;
                        }
                        if let Some(after) = after {
                            after(&state);
                        }
                        let now = Instant::now();
                        state.log_answer(&id, &answer, traceparent.as_deref());
                        state
                            .answered
                            .lock()
                            .entry((id, answer.code))
                            .or_insert(Answered { count: 0, first: now })
                            .count += 1;
                        let _ = respond(sink, &request, &answer).await;
                    });
                },
            )
            .build();
        let args = ChannelBuilder::new(Arc::clone(&env)).reuse_port(false).build_args();
        let mut server = ServerBuilder::new(env)
            .channel_args(args)
            .register_service(service)
            .build()
            .map_err(SimError::Build)?;
        let credentials = match &state.config.tls {
            None => ServerCredentials::insecure(),
            Some(tls) => {
                let mut builder =
                    ServerCredentialsBuilder::new().add_cert(tls.cert_chain.clone(), tls.key.clone());
                if let Some(ca) = &tls.client_ca {
                    builder = builder.root_cert(
                        ca.clone(),
                        CertificateRequestType::RequestAndRequireClientCertificateAndVerify,
                    );
                }
                builder.build()
            }
        };
        let port = server
            .add_listening_port(state.config.listen.to_string(), credentials)
            .map_err(|source| SimError::Listen { addr: state.config.listen, source })?;
        server.start();
        let addr = SocketAddr::new(state.config.listen.ip(), port);
        Ok(Sim { state, server, addr })
    }

    /// From now on, writes every answer sent and every idle actor
    /// suspended to `file`, one JSON object per line, so that a test run in
    /// another process can hold what clients saw against what the control
    /// plane said: `{"time": <unix seconds>, "actor", "code"}` plus `"ip"`
    /// and `"resumed"` for OK, and `{"time", "actor", "suspended": <ip>}`
    /// when the pool takes an idle actor's worker back.
    pub fn log_answers_to(&self, file: std::fs::File) {
        *self.state.answer_log.lock() = Some(file);
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Scripts `actor` (`atespace/name`): each call takes the next answer; the
    /// last one repeats. Replaces any earlier script for that actor.
    pub fn script(&self, actor: &str, answers: Vec<Answer>) {
        assert!(!answers.is_empty(), "a script needs at least one answer");
        self.state.scripts.lock().insert(actor.to_string(), answers.into());
    }

    /// Scripts several actors from `(actor, answer)` pairs, in order.
    pub fn script_all(&self, answers: Vec<(String, Answer)>) {
        let mut scripts = self.state.scripts.lock();
        for (actor, answer) in answers {
            scripts.entry(actor).or_default().push_back(answer);
        }
    }

    /// Lets every held answer for `actor` go; returns how many were held.
    pub fn release(&self, actor: &str) -> usize {
        let gates = self.state.gates.lock().remove(actor).unwrap_or_default();
        let held = gates.len();
        for gate in gates {
            let _ = gate.send(());
        }
        held
    }

    /// Lets every held answer go, for every actor; returns how many.
    pub fn release_all(&self) -> usize {
        let gates: Vec<_> = self.state.gates.lock().drain().flat_map(|(_, gates)| gates).collect();
        let held = gates.len();
        for gate in gates {
            let _ = gate.send(());
        }
        held
    }

    /// While `hang` is true, every call is accepted and never answered; when
    /// it goes back to false, the calls held meanwhile are answered as usual.
    /// Returns how many calls were released.
    pub fn set_unresponsive(&self, hang: bool) -> usize {
        let mut unresponsive = self.state.unresponsive.lock();
        if hang {
            unresponsive.get_or_insert_with(Vec::new);
            return 0;
        }
        let held = unresponsive.take().unwrap_or_default();
        let released = held.len();
        for open in held {
            let _ = open.send(());
        }
        released
    }

    /// Adds a free worker to the pool: one more resume can succeed (a test
    /// frees workers one at a time into a saturated pool).
    pub fn add_worker(&self) {
        let mut pool = self.state.pool.lock();
        let worker = pool.workers;
        pool.workers += 1;
        pool.free.push(worker);
    }

    /// Calls received for `actor` so far.
    pub fn calls(&self, actor: &str) -> u64 {
        self.state.calls.lock().get(actor).copied().unwrap_or(0)
    }

    /// Answers sent so far with `code`, to actors for which `which` holds.
    pub fn answered(&self, code: Code, which: impl Fn(&str) -> bool) -> u64 {
        self.state
            .answered
            .lock()
            .iter()
            .filter(|((actor, c), _)| *c == code && which(actor))
            .map(|(_, a)| a.count)
            .sum()
    }

    /// When `actor` was first answered with `code`, if it was.
    pub fn first_answered(&self, actor: &str, code: Code) -> Option<Instant> {
        self.state.answered.lock().get(&(actor.to_string(), code)).map(|a| a.first)
    }

    /// Calls received but not answered yet.
    pub fn unanswered(&self) -> u64 {
        let answered: u64 = self.state.answered.lock().values().map(|a| a.count).sum();
        self.total_calls() - answered
    }

    /// Calls received for every actor.
    pub fn total_calls(&self) -> u64 {
        self.state.calls.lock().values().sum()
    }

    /// Waits until `actor` has had at least `n` calls; false on timeout.
    pub fn wait_for_calls(&self, actor: &str, n: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut calls = self.state.calls.lock();
        while calls.get(actor).copied().unwrap_or(0) < n {
            if self.state.calls_changed.wait_until(&mut calls, deadline).timed_out() {
                return calls.get(actor).copied().unwrap_or(0) >= n;
            }
        }
        true
    }

    /// The `authorization` header of the latest call, if any.
    pub fn last_authorization(&self) -> Option<String> {
        self.state.last_authorization.lock().clone()
    }

    /// Faults injected so far (pool model).
    pub fn faults(&self) -> Faults {
        *self.state.faults.lock()
    }

    /// Stops the server, waiting for it.
    pub fn stop(mut self) {
        let _ = futures::executor::block_on(self.server.shutdown());
        self.state.timer.stop();
    }
}

/// Work to do when a delayed answer is finally sent.
type AfterAnswer = Box<dyn FnOnce(&State) + Send>;

impl State {
    fn new(config: SimConfig) -> State {
        let actors = (0..config.actors)
            .map(|i| (format!("{}/actor-{i}", config.atespace), ActorSim::Suspended))
            .collect();
        let free = (0..config.workers).rev().collect();
        State {
            started: Instant::now(),
            pool: Mutex::new(PoolState {
                actors,
                free,
                workers: config.workers,
                next_sweep: Some(Instant::now()),
            }),
            scripts: Mutex::new(HashMap::new()),
            calls: Mutex::new(HashMap::new()),
            calls_changed: Condvar::new(),
            answered: Mutex::new(HashMap::new()),
            gates: Mutex::new(HashMap::new()),
            unresponsive: Mutex::new(None),
            faults: Mutex::new(Faults::default()),
            last_authorization: Mutex::new(None),
            answer_log: Mutex::new(None),
            timer: TimerThread::start(),
            config,
        }
    }

    fn answer(&self, request: &ResumeActorRequest) -> (String, Answer, Option<AfterAnswer>) {
        let object = request.actor.as_ref();
        let id = format!(
            "{}/{}",
            object.map_or("", |o| o.atespace.as_str()),
            object.map_or("", |o| o.name.as_str())
        );
        {
            let mut calls = self.calls.lock();
            *calls.entry(id.clone()).or_default() += 1;
            self.calls_changed.notify_all();
        }
        if let Some(script) = self.scripts.lock().get_mut(&id) {
            let answer = if script.len() > 1 { script.pop_front() } else { script.front().cloned() };
            return (id, answer.expect("scripts are never empty"), None);
        }
        let (answer, after) = self.pool_answer(&id);
        (id, answer, after)
    }

    fn pool_answer(&self, id: &str) -> (Answer, Option<AfterAnswer>) {
        let now = Instant::now();
        let fault = |f: fn(&mut Faults) -> &mut u64| *f(&mut self.faults.lock()) += 1;
        let mut pool = self.pool.lock();
        // An unknown actor is NotFound whatever else happens, outages
        // included, so a test can hold it to exactly that verdict.
        if !pool.actors.contains_key(id) {
            fault(|f| &mut f.not_found);
            return (Answer::error(Code::NotFound, &format!("actor {id} not found")), None);
        }
        if self.in_outage(now) {
            fault(|f| &mut f.outage);
            return (Answer::error(Code::Unavailable, "control plane restarting"), None);
        }
        if fastrand::f64() < self.config.unavailable_rate {
            fault(|f| &mut f.unavailable);
            return (Answer::error(Code::Unavailable, "connection reset"), None);
        }
        if fastrand::f64() < self.config.aborted_rate {
            fault(|f| &mut f.aborted);
            return (Answer::error(Code::Aborted, "concurrent operation in progress"), None);
        }
        self.suspend_idle(&mut pool, now);
        match pool.actors[id] {
            ActorSim::Running { worker, .. } => {
                if let Some(actor) = pool.actors.get_mut(id) {
                    *actor = ActorSim::Running { worker, last_resume: now };
                }
                (Answer::ok(&self.worker_ip(worker), false), None)
            }
            ActorSim::Resuming => (Answer::error(Code::Aborted, "actor is being resumed"), None),
            ActorSim::Suspended => {
                let Some(worker) = pool.free.pop() else {
                    fault(|f| &mut f.exhausted);
                    return (Answer::error(Code::ResourceExhausted, "no free workers available"), None);
                };
                pool.actors.insert(id.to_string(), ActorSim::Resuming);
                let spread = self.config.restore_jitter * (2.0 * fastrand::f64() - 1.0);
                let delay = if fastrand::f64() < self.config.slow_restore_rate {
                    fault(|f| &mut f.slow_restores);
                    self.config.slow_restore
                } else {
                    self.config.restore_latency.mul_f64((1.0 + spread).max(0.0))
                };
                let id = id.to_string();
                let after: AfterAnswer = Box::new(move |state: &State| {
                    let running = ActorSim::Running { worker, last_resume: Instant::now() };
                    state.pool.lock().actors.insert(id, running);
                });
                (Answer::ok(&self.worker_ip(worker), true).after(delay), Some(after))
            }
        }
    }

    fn in_outage(&self, now: Instant) -> bool {
        let every = self.config.outage_every;
        if every.is_zero() || self.config.outage_for.is_zero() {
            return false;
        }
        let phase = now.duration_since(self.started).as_nanos() % every.as_nanos();
        phase >= (every.as_nanos() - self.config.outage_for.as_nanos().min(every.as_nanos()))
    }

    /// Suspends the running actors idle for `idle_suspend`. An actor starts
    /// running or is resumed no earlier than the sweep that set
    /// `next_sweep`, so its own expiry is never before it.
    fn suspend_idle(&self, pool: &mut PoolState, now: Instant) {
        if pool.next_sweep.is_none_or(|at| now < at) {
            return;
        }
        let idle = self.config.idle_suspend;
        let mut expired = Vec::new();
        let mut next = now.checked_add(idle);
        for (id, state) in &pool.actors {
            if let ActorSim::Running { worker, last_resume } = *state {
                match last_resume.checked_add(idle) {
                    Some(at) if at <= now => expired.push((id.clone(), worker)),
                    Some(at) => next = Some(next.map_or(at, |n| n.min(at))),
                    None => {}
                }
            }
        }
        pool.next_sweep = next;
        for (id, worker) in expired {
            self.log_line(&format!(",\"suspended\":\"{}\"", self.worker_ip(worker)), &id);
            pool.actors.insert(id, ActorSim::Suspended);
            pool.free.push(worker);
        }
    }

    /// One line of the answer log for an answer sent to `id`.
    /// `traceparent` is the call's, when it carried one.
    fn log_answer(&self, id: &str, answer: &Answer, traceparent: Option<&str>) {
        let mut fields = match (answer.code, answer.ips.first()) {
            (Code::Ok, Some(ip)) => {
                format!(",\"code\":\"OK\",\"ip\":{},\"resumed\":{}", json_string(ip), answer.resumed)
            }
            (code, _) => format!(",\"code\":\"{}\"", code.name()),
        };
        if let Some(traceparent) = traceparent {
            fields.push_str(&format!(",\"traceparent\":{}", json_string(traceparent)));
        }
        self.log_line(&fields, id);
    }

    /// Writes `{"time":…,"actor":…<fields>}` and a newline in one write, so
    /// that a reader never sees half a line it could take for a whole one.
    fn log_line(&self, fields: &str, id: &str) {
        let mut log = self.answer_log.lock();
        let Some(file) = log.as_mut() else { return };
        let time = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        let line = format!("{{\"time\":{time:.6},\"actor\":{}{fields}}}\n", json_string(id));
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!("ateapi-sim: answer log: {e}; no longer logging");
            *log = None;
        }
    }
}

/// Parses a script file: one answer per line, in order per actor:
///
/// ```text
/// # actor      code               delay  ips                 resumed  message
/// demo/slow    ResourceExhausted  0s     -                   false    no free workers available
/// demo/slow    OK                 250ms  10.0.0.7,fd00::7    true     -
/// ```
///
/// `ips` and `message` take `-` for none; the message is the rest of the
/// line. A delay of `held` holds the answer until [`Sim::release_all`]
/// (`ateapi-sim` calls it on SIGUSR1). Blank lines and `#` comments are
/// skipped.
pub fn parse_script(text: &str) -> Result<Vec<(String, Answer)>, ScriptError> {
    let mut answers = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fail = |why: &str| ScriptError { line: n + 1, text: line.to_string(), reason: why.to_string() };
        let mut parts = line.split_whitespace();
        let mut next = |what: &str| parts.next().ok_or_else(|| fail(&format!("missing {what}")));
        let actor = next("actor")?.to_string();
        let code = code_named(next("code")?).ok_or_else(|| fail("unknown code"))?;
        let (delay, held) = match next("delay")? {
            "held" => (Duration::ZERO, true),
            delay => (crate::cli::godur::parse(delay).map_err(|e| fail(&e.to_string()))?.magnitude, false),
        };
        let ips = match next("ips")? {
            "-" => Vec::new(),
            list => list.split(',').map(str::to_string).collect(),
        };
        let resumed = next("resumed")?.parse::<bool>().map_err(|_| fail("resumed must be true or false"))?;
        let message = parts.collect::<Vec<_>>().join(" ");
        let message = if message == "-" { String::new() } else { message };
        answers.push((actor, Answer { code, message, delay, ips, resumed, held }));
    }
    Ok(answers)
}

fn code_named(name: &str) -> Option<Code> {
    (0..17)
        .map(Code::from_i32)
        .find(|c| c.name().eq_ignore_ascii_case(name) || (name == "Cancelled" && *c == Code::Cancelled))
}

impl State {
    fn worker_ip(&self, worker: usize) -> String {
        self.config.worker_ips.of(worker).to_string()
    }
}

async fn respond(
    sink: UnarySink<ResumeActorResponse>,
    request: &ResumeActorRequest,
    answer: &Answer,
) -> grpcio::Result<()> {
    if answer.code != Code::Ok {
        let status = RpcStatus::with_message(RpcStatusCode::from(answer.code as i32), answer.message.clone());
        return sink.fail(status).await;
    }
    let object = request.actor.clone().unwrap_or_default();
    let mut assignment = WorkerAssignment::new();
    assignment.worker_pod_ips = answer.ips.clone();
    assignment.worker_pool = "default".into();
    let mut status = ActorStatus::new();
    status.state = ActorState::RUNNING.into();
    if !answer.ips.is_empty() {
        status.worker_assignment = MessageField::some(assignment);
    }
    let mut metadata = ResourceMetadata::new();
    metadata.atespace = object.atespace.clone();
    metadata.name = object.name.clone();
    let mut actor = Actor::new();
    actor.metadata = MessageField::some(metadata);
    actor.status = MessageField::some(status);
    let mut response = ResumeActorResponse::new();
    response.actor = MessageField::some(actor);
    response.resumed = answer.resumed;
    sink.success(response).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_ips_from_a_network() {
        let net = Ipv4Net::parse("127.0.1.77/24").unwrap();
        assert_eq!(net.hosts(), 254);
        let ips = WorkerIps::Network(net);
        assert_eq!(ips.of(0).to_string(), "127.0.1.1");
        assert_eq!(ips.of(253).to_string(), "127.0.1.254");
        assert_eq!(WorkerIps::UNREACHABLE.of(999_999).to_string(), "10.79.66.64");
        for bad in ["127.0.1.0", "127.0.1.0/31", "127.0.1.0/7", "::1/24", "127.0.1/24", "127.0.1.0/x"] {
            assert!(Ipv4Net::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_idle_actor_frees_its_worker_and_a_busy_one_keeps_it() {
        let idle = Duration::from_millis(100);
        let config = SimConfig { workers: 1, actors: 3, idle_suspend: idle, ..SimConfig::default() };
        let state = State::new(config);
        let code = |actor: &str| {
            let (answer, after) = state.pool_answer(actor);
            if let Some(after) = after {
                after(&state);
            }
            answer.code
        };
        assert_eq!(code("demo/actor-0"), Code::Ok);
        assert_eq!(code("demo/actor-1"), Code::ResourceExhausted, "the only worker is taken");
        std::thread::sleep(idle * 2);
        assert_eq!(code("demo/actor-1"), Code::Ok, "actor-0 idled out and freed the worker");
        assert_eq!(code("demo/actor-1"), Code::Ok, "running: resumed again");
        assert_eq!(code("demo/actor-2"), Code::ResourceExhausted, "actor-1 is not idle");
    }

    #[test]
    fn the_answer_log_has_one_whole_line_per_answer_and_per_suspension() {
        let idle = Duration::from_millis(50);
        let config = SimConfig { workers: 1, actors: 2, idle_suspend: idle, ..SimConfig::default() };
        let state = State::new(config);
        let path = std::env::temp_dir().join(format!("ateapi-sim-answers-{}.jsonl", std::process::id()));
        *state.answer_log.lock() = Some(std::fs::File::create(&path).unwrap());
        let answer = |actor: &str| {
            let (answer, after) = state.pool_answer(actor);
            if let Some(after) = after {
                after(&state);
            }
            state.log_answer(actor, &answer, None);
        };
        answer("demo/actor-0");
        answer("demo/actor-1");
        std::thread::sleep(idle * 2);
        answer("demo/\"odd\"");
        answer("demo/actor-1");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let lines: Vec<&str> = text.lines().map(|l| l.split_once(",\"actor\"").unwrap().1).collect();
        assert_eq!(
            lines,
            [
                r#":"demo/actor-0","code":"OK","ip":"10.64.0.1","resumed":true}"#,
                r#":"demo/actor-1","code":"ResourceExhausted"}"#,
                r#":"demo/\"odd\"","code":"NotFound"}"#,
                r#":"demo/actor-0","suspended":"10.64.0.1"}"#,
                r#":"demo/actor-1","code":"OK","ip":"10.64.0.1","resumed":true}"#,
            ]
        );
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        for line in text.lines() {
            let time: f64 =
                line.strip_prefix("{\"time\":").unwrap().split(',').next().unwrap().parse().unwrap();
            assert!(time <= now && time > now - 60.0, "unix seconds: {line}");
        }
    }

    #[test]
    fn parses_scripts() {
        let text = "# comment\n\ndemo/a ResourceExhausted 0s - false no free workers available\n\
                    demo/a OK 250ms 10.0.0.7,fd00::7 true -\n";
        let answers = parse_script(text).unwrap();
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0].1, Answer::error(Code::ResourceExhausted, "no free workers available"));
        assert_eq!(
            answers[1].1,
            Answer { ips: vec!["10.0.0.7".into(), "fd00::7".into()], ..Answer::ok("x", true) }
                .after(Duration::from_millis(250))
        );
        let held = parse_script("demo/a OK held 10.0.0.7 true -").unwrap();
        assert_eq!(held[0].1, Answer::ok("10.0.0.7", true).held());
        assert!(parse_script("demo/a Bogus 0s - false x").is_err());
        assert!(parse_script("demo/a OK 0s").is_err());
    }
}
