//! The memory and string routines the compiler calls for the runtime's own code (`memcpy`,
//! `memmove`, `memset`, `memcmp`, `bcmp`, `strlen`), defined here with hidden visibility by
//! [`uprobe_memfns::define!`] (shared with the handler SDK).
//!
//! Without them every struct copy and slice comparison in the runtime would call libc's, and
//! libc's functions may carry probes: the runtime would hit its own probes while placing them
//! (a trap each with `--no-optimize`) and on its hit paths. Hidden symbols bind inside this
//! library only; the program keeps calling libc's. Signal-safe: no state, no calls.

uprobe_memfns::define!();
