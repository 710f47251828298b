//! The operating system's part of measuring: thread priorities (real-time for the pacer, the
//! probe and the workers, nice where real-time is refused) and CPUs (which ones a thread may use,
//! pinning, the one it runs on now, its CPU time). Linux only; elsewhere each call reports that it
//! did not take, and the run records that.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Puts the calling thread at real-time priority `level` (SCHED_FIFO), when the process may
/// (root, `CAP_SYS_NICE` or an `RLIMIT_RTPRIO` of `level` or more): such a thread is woken at
/// once, ahead of every normal one, where a normal thread waits up to a scheduler slice while
/// the server keeps the cores busy. The pacer sleeps between wake-ups and spins only the last
/// stretch, so the server loses next to nothing. A thread or process it starts is normal again
/// (reset on fork). Returns whether it took.
pub fn realtime_priority(level: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: level };
        // SAFETY: a plain system call on the calling thread (pid 0) with a valid parameter.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = level;
        false
    }
}

/// The workers' real-time priority, below the pacer's.
pub const WORKER_PRIORITY: i32 = 1;

/// The priority the client's workers ran at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// Real-time (SCHED_FIFO 1, below the pacer).
    Realtime,
    /// Nice -10: real-time was refused.
    Nice,
    /// Normal: both were refused.
    Normal,
}

/// The nice value a thread asks for when real-time is refused.
pub(crate) const RAISED_NICE: i32 = -10;
/// Whether some worker ran at each priority.
static WORKERS_AT: [AtomicBool; 3] = [AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false)];

/// Nice -10 for the calling thread, when the process may (root or `CAP_SYS_NICE`). Returns
/// whether it took.
fn raised_nice() -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: a plain system call on the calling thread (`who` 0 is the caller's own thread).
    return unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, RAISED_NICE) == 0 };
    #[cfg(not(target_os = "linux"))]
    false
}

/// Puts a worker of the client's runtime, which sends what the pacer wakes and reads the
/// streams, at real-time priority as the pacer, or else at nice -10, when the process may: it
/// then runs the moment it is woken, ahead of a server whose threads keep every core busy. At
/// nice -10 a send still waited up to tens of milliseconds behind such a server; the client
/// needs little CPU, so the server loses next to nothing. The embedded server's runtime never
/// calls it.
pub fn raise_worker() {
    let took = if realtime_priority(WORKER_PRIORITY) {
        Workers::Realtime
    } else if raised_nice() {
        Workers::Nice
    } else {
        Workers::Normal
    };
    WORKERS_AT[took as usize].store(true, Ordering::Relaxed);
}

/// Nice -10 for the thread that runs the groups and spawns each open-loop request ahead of its
/// time (not real-time: it also does the run's own computing, which must not hold a core from
/// the servers). Its lead covers the rest.
pub fn raise_spawner() {
    let _ = raised_nice();
}

/// The priority every worker that started ran at (the lowest any took); `None` when none
/// asked (an embedded server in the client's process shares its workers: none is raised above
/// it).
pub fn workers_raised() -> Option<Workers> {
    [Workers::Normal, Workers::Nice, Workers::Realtime]
        .into_iter()
        .find(|&w| WORKERS_AT[w as usize].load(Ordering::Relaxed))
}
/// The CPUs the calling thread may run on.
pub fn allowed_cpus() -> Option<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is a valid empty set, filled by the kernel for the calling
        // thread (pid 0) with its own size passed.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let got = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        // SAFETY: CPU_ISSET reads the set within CPU_SETSIZE.
        (got == 0).then(|| (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Pins the calling thread to `cpu`; whether it took.
pub fn pin(cpu: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it (`cpu` came
        // from the allowed set, below CPU_SETSIZE); the call reads it with its own size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

/// The CPU time the calling thread has taken.
pub fn thread_cpu_time() -> Duration {
    #[cfg(target_os = "linux")]
    {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: the kernel fills the timespec passed.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0 {
            return Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32);
        }
    }
    Duration::ZERO
}

/// The CPU the calling thread runs on now (Linux), recorded with each send so that its delay is
/// matched against that CPU's stalls.
pub fn current_cpu() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a plain call with no arguments.
        usize::try_from(unsafe { libc::sched_getcpu() }).ok()
    }
    #[cfg(not(target_os = "linux"))]
    None
}
