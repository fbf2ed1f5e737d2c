//! Deadlines without a thread per waiter.
//!
//! One [`TimerThread`] fires every retry, budget deadline and sleep in the
//! process. It keeps a binary heap ordered by deadline and sleeps on a
//! `parking_lot` condvar until the earliest one, so a retry fires within the
//! scheduler's wake-up latency of its due time. A hashed wheel would make
//! insertion O(1) instead of O(log n), but it rounds every deadline to a tick;
//! with at most tens of thousands of pending timers the heap costs
//! microseconds, and exact deadlines are what the budget contract (B19) wants.
//!
//! Tasks run on the timer thread and must be short: they start an RPC or wake
//! a future, never wait for one.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// Work to run when a deadline passes.
pub type Task = Box<dyn FnOnce() + Send + 'static>;

/// Identifies a scheduled task so it can be cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

/// Runs tasks at instants. Implemented by the real [`TimerThread`] and by the
/// deterministic [`ManualScheduler`] used in tests.
pub trait Scheduler: Send + Sync + 'static {
    /// Runs `task` at or soon after `at`.
    fn schedule(&self, at: Instant, task: Task) -> TimerId;
    /// Drops a task that has not run yet; a no-op once it has.
    fn cancel(&self, id: TimerId);
}

/// What the timer thread is doing, so `schedule` wakes it only when a new
/// task is due before it would wake anyway.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ThreadState {
    /// Running tasks; it looks at the queue again before it sleeps.
    #[default]
    Running,
    Until(Instant),
    Forever,
}

/// The pending tasks, shared by both schedulers.
///
/// A cancelled task leaves its heap entry behind (removing from the middle
/// of a heap is O(n)); entries whose task is gone are skipped when they
/// reach the top, and the heap is rebuilt when they outnumber live tasks.
#[derive(Default)]
struct Queue {
    order: BinaryHeap<Reverse<(Instant, u64)>>,
    tasks: HashMap<u64, Task>,
    next_id: u64,
    stopped: bool,
    thread: ThreadState,
}

impl Queue {
    fn push(&mut self, at: Instant, task: Task) -> TimerId {
        let id = self.next_id;
        self.next_id += 1;
        self.order.push(Reverse((at, id)));
        self.tasks.insert(id, task);
        TimerId(id)
    }

    /// Removes cancelled heads; returns the earliest live deadline.
    fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((at, id))) = self.order.peek().copied() {
            if self.tasks.contains_key(&id) {
                return Some(at);
            }
            self.order.pop();
        }
        None
    }

    /// Takes every task due at `now` with its deadline, earliest first.
    fn take_due(&mut self, now: Instant) -> Vec<(Instant, Task)> {
        let mut due = Vec::new();
        while let Some(Reverse((at, id))) = self.order.peek().copied() {
            if at > now {
                break;
            }
            self.order.pop();
            if let Some(task) = self.tasks.remove(&id) {
                due.push((at, task));
            }
        }
        due
    }

    #[cfg(any(test, feature = "testkit"))]
    fn len(&self) -> usize {
        self.tasks.len()
    }

    fn cancel(&mut self, id: u64) {
        if self.tasks.remove(&id).is_some()
            && self.order.len() > 1024
            && self.order.len() > 4 * self.tasks.len()
        {
            let tasks = &self.tasks;
            self.order.retain(|Reverse((_, id))| tasks.contains_key(id));
        }
    }
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Records how late each task ran against its deadline, in seconds.
    lateness: Option<prometheus::Histogram>,
}

/// The process's one timer thread.
pub struct TimerThread {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl TimerThread {
    /// Starts the thread.
    #[cfg(any(test, feature = "testkit"))]
    pub fn start() -> Arc<TimerThread> {
        TimerThread::start_observed(None)
    }

    /// Starts the thread, recording each task's lateness in `lateness`.
    pub fn start_observed(lateness: Option<prometheus::Histogram>) -> Arc<TimerThread> {
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), wake: Condvar::new(), lateness });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("atenet-timer".into())
            .spawn(move || run(&worker))
            .expect("spawning the timer thread");
        Arc::new(TimerThread { shared, thread: Mutex::new(Some(thread)) })
    }

    /// How many tasks are waiting.
    #[cfg(any(test, feature = "testkit"))]
    pub fn pending(&self) -> usize {
        self.shared.queue.lock().len()
    }

    /// Stops the thread; pending tasks are dropped without running.
    pub fn stop(&self) {
        self.shared.queue.lock().stopped = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TimerThread {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Scheduler for TimerThread {
    fn schedule(&self, at: Instant, task: Task) -> TimerId {
        let mut queue = self.shared.queue.lock();
        let wake = match queue.thread {
            ThreadState::Running => false,
            ThreadState::Until(until) => at < until,
            ThreadState::Forever => true,
        };
        let id = queue.push(at, task);
        if wake {
            queue.thread = ThreadState::Running;
        }
        drop(queue);
        if wake {
            self.shared.wake.notify_one();
        }
        id
    }

    fn cancel(&self, id: TimerId) {
        self.shared.queue.lock().cancel(id.0);
    }
}

fn run(shared: &Shared) {
    let mut queue = shared.queue.lock();
    loop {
        if queue.stopped {
            queue.tasks.clear();
            return;
        }
        let now = Instant::now();
        let due = queue.take_due(now);
        if !due.is_empty() {
            drop(queue);
            for (at, task) in due {
                if let Some(lateness) = &shared.lateness {
                    lateness.observe(now.saturating_duration_since(at).as_secs_f64());
                }
                task();
            }
            queue = shared.queue.lock();
            continue;
        }
        match queue.next_deadline() {
            Some(at) => {
                queue.thread = ThreadState::Until(at);
                shared.wake.wait_until(&mut queue, at);
            }
            None => {
                queue.thread = ThreadState::Forever;
                shared.wake.wait(&mut queue);
            }
        }
        queue.thread = ThreadState::Running;
    }
}

/// A future that completes at an instant; dropping it cancels its timer.
pub struct Sleep {
    state: Arc<SleepState>,
    scheduler: Arc<dyn Scheduler>,
    timer: Option<TimerId>,
}

#[derive(Default)]
struct SleepState {
    fired: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

/// Sleeps until `at` on `scheduler`.
pub fn sleep_until(scheduler: Arc<dyn Scheduler>, at: Instant) -> Sleep {
    let state = Arc::new(SleepState::default());
    let fired = Arc::clone(&state);
    let timer = scheduler.schedule(
        at,
        Box::new(move || {
            fired.fired.store(true, Ordering::Release);
            if let Some(waker) = fired.waker.lock().take() {
                waker.wake();
            }
        }),
    );
    Sleep { state, scheduler, timer: Some(timer) }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.state.fired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        *self.state.waker.lock() = Some(cx.waker().clone());
        // Re-check: the task may have fired between the load and the store.
        if self.state.fired.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(timer) = self.timer.take() {
            self.scheduler.cancel(timer);
        }
    }
}

#[cfg(any(test, feature = "testkit"))]
pub use testing::ManualScheduler;

/// What the tests, the simulator and the load tools need of the timer: a
/// scheduler on a manual clock, and a sleeping future.
#[cfg(any(test, feature = "testkit"))]
mod testing {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use parking_lot::Mutex;

    use super::{Queue, Scheduler, Task, TimerId};
    use crate::parking::clock::{Clock, ManualClock};

    /// A scheduler driven by a [`ManualClock`]: tasks run only inside
    /// [`ManualScheduler::advance`], on the caller's thread, in deadline order.
    #[derive(Clone)]
    pub struct ManualScheduler {
        clock: ManualClock,
        pub(super) queue: Arc<Mutex<Queue>>,
    }

    impl ManualScheduler {
        /// A scheduler reading `clock`.
        pub fn new(clock: ManualClock) -> ManualScheduler {
            ManualScheduler { clock, queue: Arc::new(Mutex::new(Queue::default())) }
        }

        /// Moves the clock forward by `by`, running every task that falls due on
        /// the way at its own instant (tasks may schedule more tasks).
        pub fn advance(&self, by: Duration) {
            let end = self.clock.now() + by;
            loop {
                let next = self.queue.lock().next_deadline();
                match next {
                    Some(at) if at <= end => {
                        self.clock.set(at);
                        let due = self.queue.lock().take_due(at);
                        for (_, task) in due {
                            task();
                        }
                    }
                    _ => break,
                }
            }
            self.clock.set(end);
        }

        /// How many tasks are waiting.
        pub fn pending(&self) -> usize {
            self.queue.lock().len()
        }
    }

    impl Scheduler for ManualScheduler {
        fn schedule(&self, at: Instant, task: Task) -> TimerId {
            self.queue.lock().push(at, task)
        }

        fn cancel(&self, id: TimerId) {
            self.queue.lock().cancel(id.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parking::clock::{Clock, ManualClock};
    use crossbeam_channel::unbounded;
    use std::time::Duration;

    #[test]
    fn manual_scheduler_runs_in_deadline_order_and_honours_cancel() {
        let clock = ManualClock::new();
        let scheduler = ManualScheduler::new(clock.clone());
        let start = clock.now();
        let log = Arc::new(Mutex::new(Vec::new()));
        for (ms, name) in [(30u64, "c"), (10, "a"), (20, "b"), (25, "cancelled")] {
            let log = Arc::clone(&log);
            let id = scheduler
                .schedule(start + Duration::from_millis(ms), Box::new(move || log.lock().push(name)));
            if name == "cancelled" {
                scheduler.cancel(id);
            }
        }
        scheduler.advance(Duration::from_millis(15));
        assert_eq!(*log.lock(), vec!["a"]);
        scheduler.advance(Duration::from_millis(100));
        assert_eq!(*log.lock(), vec!["a", "b", "c"]);
        assert_eq!(scheduler.pending(), 0);
        assert_eq!(clock.now(), start + Duration::from_millis(115));
    }

    #[test]
    fn timer_thread_fires_in_order_and_cancel_prevents_run() {
        let timer = TimerThread::start();
        let (tx, rx) = unbounded();
        // A cancelled task far in the future cannot fire however slowly this
        // thread reaches the cancel; the others run in deadline order however
        // late the timer thread wakes (all due together is still in order).
        let now = Instant::now();
        let tx2 = tx.clone();
        let id = timer.schedule(now + Duration::from_secs(3600), Box::new(move || tx2.send(99).unwrap()));
        for (ms, n) in [(40u64, 3), (5, 1), (20, 2)] {
            let tx = tx.clone();
            timer.schedule(now + Duration::from_millis(ms), Box::new(move || tx.send(n).unwrap()));
        }
        timer.cancel(id);
        let got: Vec<i32> = (0..3).map(|_| rx.recv_timeout(Duration::from_secs(60)).unwrap()).collect();
        assert_eq!(got, vec![1, 2, 3]);
        assert!(rx.try_recv().is_err());
        assert_eq!(timer.pending(), 0, "the cancelled task is gone");
        timer.stop();
    }

    #[test]
    fn cancelled_entries_do_not_accumulate() {
        let clock = ManualClock::new();
        let scheduler = ManualScheduler::new(clock.clone());
        let far = clock.now() + Duration::from_secs(3600);
        scheduler.schedule(far, Box::new(|| {}));
        for i in 0..100_000u64 {
            let id = scheduler.schedule(far + Duration::from_millis(i), Box::new(|| {}));
            scheduler.cancel(id);
        }
        assert_eq!(scheduler.pending(), 1);
        assert!(scheduler.queue.lock().order.len() <= 1025, "heap rebuilt once cancelled entries dominate");
    }

    #[test]
    fn timer_thread_wakes_for_an_earlier_task_scheduled_while_it_sleeps() {
        let timer = TimerThread::start();
        let (tx, rx) = unbounded();
        let now = Instant::now();
        let late = tx.clone();
        timer.schedule(now + Duration::from_secs(3600), Box::new(move || late.send("late").unwrap()));
        // Let the thread go to sleep until the far deadline.
        while timer.shared.queue.lock().thread == ThreadState::Running {
            std::thread::yield_now();
        }
        timer.schedule(now + Duration::from_millis(5), Box::new(move || tx.send("early").unwrap()));
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "early");
        timer.stop();
    }

    #[test]
    fn sleep_future_completes_and_drop_cancels() {
        let clock = ManualClock::new();
        let scheduler = ManualScheduler::new(clock.clone());
        let shared: Arc<dyn Scheduler> = Arc::new(scheduler.clone());
        let mut sleep = sleep_until(Arc::clone(&shared), clock.now() + Duration::from_secs(1));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
        scheduler.advance(Duration::from_secs(1));
        assert!(Pin::new(&mut sleep).poll(&mut cx).is_ready());
        let dropped = sleep_until(shared, clock.now() + Duration::from_secs(1));
        assert_eq!(scheduler.pending(), 1);
        drop(dropped);
        assert_eq!(scheduler.pending(), 0);
    }
}
