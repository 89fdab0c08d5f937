// Clang thread-safety annotations (as absl/base/thread_annotations.h). No-ops elsewhere.
#pragma once

#if defined(__clang__)
#define KC_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KC_THREAD_ANNOTATION(x)
#endif

#define KC_CAPABILITY(x) KC_THREAD_ANNOTATION(capability(x))
#define KC_SCOPED_CAPABILITY KC_THREAD_ANNOTATION(scoped_lockable)
#define KC_GUARDED_BY(x) KC_THREAD_ANNOTATION(guarded_by(x))
#define KC_PT_GUARDED_BY(x) KC_THREAD_ANNOTATION(pt_guarded_by(x))
#define KC_ACQUIRED_AFTER(...) KC_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define KC_REQUIRES(...) KC_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define KC_EXCLUDES(...) KC_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define KC_ACQUIRE(...) KC_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define KC_RELEASE(...) KC_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define KC_TRY_ACQUIRE(...) KC_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define KC_RETURN_CAPABILITY(x) KC_THREAD_ANNOTATION(lock_returned(x))
#define KC_NO_THREAD_SAFETY_ANALYSIS KC_THREAD_ANNOTATION(no_thread_safety_analysis)
