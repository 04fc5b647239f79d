"""Settings for the spotpipe control plane, read from the environment (12-factor).

Every setting has an embedded default so that a fresh clone runs with no servers at all: SQLite in
`var/`, and a Celery broker on the local filesystem.

Production is the default (fail closed): a process started with no environment refuses to start
until it gets a real SECRET_KEY and ALLOWED_HOSTS, and refuses DEBUG. Development mode (DEBUG on,
a built-in key, any host) must be asked for explicitly with SPOTPIPE_DEV=1 (or
DJANGO_ENV=development); `make`, `spotpipe demo` and the test suite (controlplane/settings_dev.py)
ask for it. DJANGO_ENV=production wins over SPOTPIPE_DEV.
"""

from __future__ import annotations

from pathlib import Path

import environ

from controlplane.beat import BEAT_SCHEDULE

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

_ASKED_ENV = env.str("DJANGO_ENV", default="")
if _ASKED_ENV not in ("", "production", "development"):
    raise environ.ImproperlyConfigured(f"DJANGO_ENV={_ASKED_ENV!r}: expected production or development")
DEV = _ASKED_ENV != "production" and (env.bool("SPOTPIPE_DEV", default=False) or _ASKED_ENV == "development")
PRODUCTION = not DEV
DJANGO_ENV = "production" if PRODUCTION else "development"
_DEV_HINT = "(or set SPOTPIPE_DEV=1 for development on this machine: never on a server)"
VAR_DIR = Path(env.str("SPOTPIPE_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)


_DEV_SECRET_KEY = "dev-insecure-spotpipe-key-change-me-" + "x" * 20
# Keys that are public knowledge: this file's development key and Django's startproject placeholder.
_KNOWN_KEY_PREFIXES = ("dev-insecure-", "django-insecure-")


def _required(name: str, default: str) -> str:
    """A secret that must be set explicitly in production."""
    if PRODUCTION:
        value = env.str(name, default="")
        if not value:
            raise environ.ImproperlyConfigured(
                f"{name} must be set in production, the default mode (it has no safe default) {_DEV_HINT}"
            )
        return value
    return env.str(name, default=default)


SECRET_KEY = _required("SECRET_KEY", _DEV_SECRET_KEY)
if PRODUCTION and SECRET_KEY.startswith(_KNOWN_KEY_PREFIXES):
    raise environ.ImproperlyConfigured(
        f"SECRET_KEY is a published development key ({SECRET_KEY[:14]}...); set a random one {_DEV_HINT}"
    )
DEBUG = env.bool("DEBUG", default=DEV)
if PRODUCTION and DEBUG:
    # DEBUG pages show settings, SQL and stack traces to anyone who triggers an error.
    raise environ.ImproperlyConfigured(f"DEBUG must be off in production {_DEV_HINT}")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=[] if PRODUCTION else ["*"])
if PRODUCTION and not ALLOWED_HOSTS:
    raise environ.ImproperlyConfigured(f"ALLOWED_HOSTS must be set in production {_DEV_HINT}")
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_filters",
    # Its system checks about the cache the rate limits count in (see "Cache" below).
    "django_ratelimit",
    "controlplane.accounts",
    "controlplane.market",
    "controlplane.fleet",
    "controlplane.jobs",
    "controlplane.billing",
    "controlplane.webhooks",
    "controlplane.orchestration",
    "controlplane.planning",
    "controlplane.observability",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves collected static files (dashboard JS/CSS, plotly.js, API docs) from gunicorn itself.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Login and webhooks are rate-limited per client IP (SPOTPIPE_RATELIMIT_* in the environment).
    "controlplane.observability.ratelimit.RateLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # A path under /api/ that no route matches: a JSON 404 like every API error (common/not_found.py).
    "controlplane.common.not_found.ApiNotFoundMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Adds job_id / instance_id from the URL to every log line of the request.
    "controlplane.observability.logs.LogContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# --- Database ---------------------------------------------------------------------------------
# PostgreSQL in production (DATABASE_URL=postgres://...); a SQLite file otherwise. SQLite runs in
# WAL mode with immediate transactions so the web server and a worker process can share it.
SQLITE_PATH = VAR_DIR / "spotpipe.sqlite3"
DATABASE_URL = env.str("DATABASE_URL", default="") or f"sqlite:///{SQLITE_PATH}"
DATABASES = {"default": environ.Env.db_url_config(DATABASE_URL)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
    )
    # Tests on a file too, not Django's default in-memory database: that one is shared between
    # threads in SQLite's shared-cache mode, whose table locks fail at once ("database table is
    # locked") instead of waiting out `timeout`, and the live-server tests run many threads at once.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test_spotpipe.sqlite3")}
else:
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth ----------------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
if PRODUCTION:
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }

# --- REST API ----------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # Per principal, counted in the shared cache (common/throttles.py; rates are tunables).
    "DEFAULT_THROTTLE_CLASSES": ["controlplane.common.throttles.ApiRateThrottle"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.common.pagination.DefaultPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "controlplane.common.schema.ApiAutoSchema",
    "EXCEPTION_HANDLER": "controlplane.common.exceptions.api_exception_handler",
    # A 400, never a 500, for JSON nested too deeply or holding a NUL (common/json_input.py).
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.common.json_input.StorableJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"]
    + ([] if PRODUCTION else ["rest_framework.renderers.BrowsableAPIRenderer"]),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "spotpipe control plane API",
    "DESCRIPTION": "Spot prices, fleet, interruption notices, training jobs and costs.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI and ReDoc from our own static files: no CDN (many clusters have no internet).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Jobs accept "auto"; the planner compares concrete strategies only. Name both enums.
    # The inbound webhook receivers are plain Django views: their paths come from webhooks/schema.py.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.webhooks.schema.add_intake_paths",
    ],
    "ENUM_NAME_OVERRIDES": {
        "JobStrategyEnum": "controlplane.jobs.models.Strategy",
        "JobStatusEnum": "controlplane.jobs.models.JobStatus",
        "PlannedStrategyEnum": "runtime.config.FAULT_TOLERANT_STRATEGIES",
    },
}

# --- Cache: rate-limit counts ------------------------------------------------------------------
# Counts must be seen by every web and worker process (a per-process cache lets N processes allow
# N times each limit): Redis when there is one (atomic INCR), else files under VAR_DIR shared by the
# processes of this host (the embedded default; its get-then-set increments can lose a count when
# two processes hit the same key at once, which only makes a limit slightly looser).
REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    # Short socket timeouts: a hung Redis must cost a request a second at most (ratelimit.py and
    # the API throttles then let it through uncounted).
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                          "KEY_PREFIX": "spotpipe",
                          "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1}}}
    # django-ratelimit supports django-redis's backend "officially" and warns about Django's own
    # (W001); Django's RedisCache has the same atomic add (SET NX) and INCR that it needs.
    SILENCED_SYSTEM_CHECKS = ["django_ratelimit.W001"]
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                          "LOCATION": str(VAR_DIR / "cache"), "OPTIONS": {"MAX_ENTRIES": 100_000}}}
    # django-ratelimit calls the file cache an error (E003: its increment is not atomic). It is
    # shared by every process of this host, which is what the limits need; a lost count under a
    # race only makes a limit slightly looser (above). Production sets REDIS_URL.
    SILENCED_SYSTEM_CHECKS = ["django_ratelimit.E003", "django_ratelimit.W001"]
# django-ratelimit's counts are the rate limits' (observability/ratelimit.py). When a count is
# missing (expired between add() and incr()), let the request through rather than refuse it.
RATELIMIT_FAIL_OPEN = True

# --- Celery --------------------------------------------------------------------------------------
# Redis in production; with no server, kombu's filesystem transport, which a real worker process
# can consume from. The dashboard reads the database, never a result backend.
BROKER_DIR = VAR_DIR / "broker"
_default_broker = "spotfs://"  # kombu's filesystem transport with atomic writes (controlplane/broker.py)
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="") or REDIS_URL or _default_broker
CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
if CELERY_BROKER_URL.startswith(("filesystem://", "spotfs://")):
    for sub in ("out", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "out"),
        "data_folder_out": str(BROKER_DIR / "out"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        # Safe with atomic message files; kombu's default of 1 s adds up to a second per hop.
        "polling_interval": 0.1,
    }
else:
    # Longer than the longest task, so an acks_late task is not redelivered while it runs.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
# Celery's own file scheduler with the schedule in code: beat needs no database. With
# django_celery_beat's DatabaseScheduler, a PostgreSQL restart followed by Redis restarts left beat
# sending detect_dead_agents ~100 times a second instead of twice (the chaos soak, bench/chaos.py):
# the flood starved every other task, so django_celery_beat is not installed (a database upgraded
# from an older spotpipe keeps its unused django_celery_beat_* tables; drop them at will).
CELERY_BEAT_SCHEDULER = "celery.beat:PersistentScheduler"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = BEAT_SCHEDULE
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Without this Celery's Django fixup closes and reopens the database connection around every task.
CELERY_DB_REUSE_MAX = 1000

# --- spotpipe ------------------------------------------------------------------------------------
# Every SPOTPIPE_* tunable of the control plane is declared, with its default and meaning, in
# controlplane/tunables.py and read with `tunable(name)`: a value set here (or by a test's settings
# fixture) wins over the environment. docs/configuration.md lists them all.

# --- Logging -------------------------------------------------------------------------------------
# JSON lines in production (with job_id / instance_id when known), plain text in development.
LOG_FORMAT = env.str("LOG_FORMAT", default="json" if PRODUCTION else "plain")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "controlplane.observability.logs.ContextFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "controlplane.observability.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["context"]}
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- Production hardening (manage.py check --deploy) -----------------------------------------------
if PRODUCTION:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True
    X_FRAME_OPTIONS = "DENY"
