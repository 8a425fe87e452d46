/* log.h - leveled diagnostics on stderr.
 *
 * One line per message: "llmd: <module>: <level>: text". The level is chosen
 * with the environment variable LLMD_LOG (error, warn, info, debug; default
 * warn) or log_set_level(). Thread safety: any thread; lines are written with
 * one fprintf each and so are not interleaved mid-line.
 */
#ifndef LLMD_LOG_H
#define LLMD_LOG_H

#include <stddef.h>

enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

void log_msg(enum log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void log_set_level(enum log_level level);

/* Format a one-line reason into a caller's error buffer (the errbuf/errlen
 * pair of every create/open call); a NULL buf or 0 len is a no-op. */
void log_errbuf(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
enum log_level log_get_level(void);

#define LOG_ERROR(mod, ...) log_msg(LOG_LEVEL_ERROR, mod, __VA_ARGS__)
#define LOG_WARN(mod, ...)  log_msg(LOG_LEVEL_WARN, mod, __VA_ARGS__)
#define LOG_INFO(mod, ...)  log_msg(LOG_LEVEL_INFO, mod, __VA_ARGS__)
#define LOG_DEBUG(mod, ...) log_msg(LOG_LEVEL_DEBUG, mod, __VA_ARGS__)

/* Defensive checks that stay in release builds (sqlite's ALWAYS/NEVER):
 * evaluate to the condition, and in debug builds assert it. */
#ifdef NDEBUG
#define ALWAYS(x) (x)
#define NEVER(x)  (x)
#else
#include <assert.h>
#define ALWAYS(x) ((x) ? 1 : (assert(0 && #x), 0))
#define NEVER(x)  ((x) ? (assert(0 && !#x), 1) : 0)
#endif

#endif /* LLMD_LOG_H */
