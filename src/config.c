/* config: the settings table that drives parsing, defaults, precedence and display. */
#include "config.h"

#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "build_config.h"

struct config_setting {
	const char *name;
	enum config_type type;
	const char *def;
	long min, max;
	const char *help;
};

static const struct config_setting config_table[CFG_COUNT] = {
#define CONFIG_ROW(id, name, type, def, min, max, help) {name, type, def, min, max, help},
    CONFIG_SETTINGS(CONFIG_ROW)
#undef CONFIG_ROW
};

static const char src_default[] = "default";
static const char src_file[] = "file";
static const char src_env[] = "environment";
static const char src_cli[] = "command line";

enum { OPT_CHECK = 1000, OPT_VERSION, OPT_HELP, OPT_SETTING = 2000 };

int config_addr_split(const char *addr, char *host, size_t hostlen, int *port)
{
	const char *colon, *h = addr;
	size_t n;
	char *end;
	long p;

	if (addr[0] == '[') {
		const char *close = strchr(addr, ']');

		if (close == NULL || close[1] != ':')
			return -1;
		h = addr + 1;
		n = (size_t)(close - h);
		colon = close + 1;
	} else {
		colon = strrchr(addr, ':');
		if (colon == NULL || memchr(addr, ':', (size_t)(colon - addr)))
			return -1;
		n = (size_t)(colon - addr);
	}
	if (n == 0 || n >= hostlen)
		return -1;
	memcpy(host, h, n);
	host[n] = '\0';
	errno = 0;
	p = strtol(colon + 1, &end, 10);
	if (errno || *end != '\0' || colon[1] == '\0' || p < 1 || p > 65535)
		return -1;
	*port = (int)p;
	return 0;
}

static void config_error(struct config *cfg, FILE *err, const char *where, const char *name,
			 const char *fmt, const char *arg)
{
	fprintf(err, "%s: %s: ", where, name);
	fprintf(err, fmt, arg);
	fputc('\n', err);
	cfg->nerrors++;
}

static void config_clear(struct config_value *v)
{
	int i;

	free(v->str);
	v->str = NULL;
	for (i = 0; i < v->nlist; i++)
		free(v->list[i]);
	v->nlist = 0;
}

/* Set one value from text; append says a repeatable setting accumulates
 * within one source. */
static void config_set(struct config *cfg, FILE *err, enum config_id id, const char *text,
		       const char *source, const char *where, int append)
{
	const struct config_setting *s = &config_table[id];
	struct config_value *v = &cfg->v[id];
	char host[256];
	int port;
	long num;
	char *end;
	enum log_level level;

	switch (s->type) {
	case CFG_ADDR:
		if (config_addr_split(text, host, sizeof(host), &port) != 0) {
			config_error(cfg, err, where, s->name, "'%s' is not HOST:PORT", text);
			return;
		}
		break;
	case CFG_LIST: {
		char *copy = strdup(text), *tok, *save = NULL;

		if (!append || v->source != source) {
			config_clear(v);
			v->source = source;
		}
		for (tok = strtok_r(copy, ", ", &save); tok;
		     tok = strtok_r(NULL, ", ", &save)) {
			if (config_addr_split(tok, host, sizeof(host), &port) != 0)
				config_error(cfg, err, where, s->name, "'%s' is not HOST:PORT",
					     tok);
			else if (v->nlist == CONFIG_MAX_LISTEN)
				config_error(cfg, err, where, s->name, "more than %s addresses",
					     "16");
			else
				v->list[v->nlist++] = strdup(tok);
		}
		free(copy);
		return;
	}
	case CFG_INT:
		errno = 0;
		num = strtol(text, &end, 10);
		if (errno || *text == '\0' || *end != '\0') {
			config_error(cfg, err, where, s->name, "'%s' is not a number", text);
			return;
		}
		if (num < s->min || num > s->max) {
			fprintf(err, "%s: %s: %ld is out of range %ld..%ld\n", where, s->name,
				num, s->min, s->max);
			cfg->nerrors++;
			return;
		}
		v->num = num;
		break;
	case CFG_LEVEL:
		if (log_level_parse(text, &level) != 0) {
			config_error(cfg, err, where, s->name,
				     "'%s' is not error, warning, info or debug", text);
			return;
		}
		v->num = level;
		break;
	case CFG_STR:
	case CFG_SECRET:
		break;
	}
	free(v->str);
	v->str = strdup(text);
	v->source = source;
}

static int config_find(const char *name)
{
	int i;

	for (i = 0; i < CFG_COUNT; i++)
		if (strcmp(config_table[i].name, name) == 0)
			return i;
	return -1;
}

static char *config_trim(char *p)
{
	char *e;

	while (isspace((unsigned char)*p))
		p++;
	e = p + strlen(p);
	while (e > p && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return p;
}

static void config_read_file(struct config *cfg, FILE *err, const char *path)
{
	char line[4096], where[4200];
	FILE *f = fopen(path, "r");
	int lineno = 0;

	if (f == NULL) {
		fprintf(err, "%s: cannot open: %s\n", path, strerror(errno));
		cfg->nerrors++;
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		char *p = config_trim(line), *eq, *key, *val;
		int id;

		lineno++;
		snprintf(where, sizeof(where), "%s:%d", path, lineno);
		if (*p == '\0' || *p == '#')
			continue;
		eq = strchr(p, '=');
		if (eq == NULL) {
			config_error(cfg, err, where, p, "%s", "expected 'name = value'");
			continue;
		}
		*eq = '\0';
		key = config_trim(p);
		val = config_trim(eq + 1);
		if (strlen(val) >= 2 && val[0] == '"' && val[strlen(val) - 1] == '"') {
			val[strlen(val) - 1] = '\0';
			val++;
		}
		id = config_find(key);
		if (id < 0) {
			config_error(cfg, err, where, key, "%s", "unknown setting");
			continue;
		}
		config_set(cfg, err, (enum config_id)id, val, src_file, where, 1);
	}
	fclose(f);
}

static void config_read_env(struct config *cfg, FILE *err)
{
	char var[128];
	int i, j;

	for (i = 0; i < CFG_COUNT; i++) {
		const char *val;

		snprintf(var, sizeof(var), "ACEMQ_PROXY_%s", config_table[i].name);
		for (j = 12; var[j]; j++)
			var[j] = (char)toupper((unsigned char)var[j]);
		val = getenv(var);
		if (val != NULL)
			config_set(cfg, err, (enum config_id)i, val, src_env, var, 0);
	}
}

static void config_usage(FILE *out, const char *prog)
{
	int i;

	fprintf(out,
		"usage: %s [-c FILE] [--listen HOST:PORT] [--upstream HOST:PORT]\n"
		"          [--rules DIR] [--data-dir DIR] [--admin HOST:PORT]\n"
		"          [--workers N] [--log-level LEVEL] [--check-config]\n"
		"          [--version] [--help]\n\n"
		"Every setting can also be given as --NAME VALUE (dashes or\n"
		"underscores), as ACEMQ_PROXY_NAME in the environment, or as\n"
		"'name = value' in the -c file. Command line > environment >\n"
		"file > default.\n\nsettings:\n",
		prog);
	for (i = 0; i < CFG_COUNT; i++)
		fprintf(out, "  %-22s %s (default \"%s\")\n", config_table[i].name,
			config_table[i].help, config_table[i].def);
}

int config_load(struct config *cfg, int argc, char **argv, FILE *err)
{
	struct option opts[CFG_COUNT * 2 + 6];
	char dashed[CFG_COUNT][64];
	const char **cli_val = calloc((size_t)argc + 1, sizeof(char *));
	int *cli_id = calloc((size_t)argc + 1, sizeof(int));
	int ncli = 0, n = 0, i, c;

	memset(cfg, 0, sizeof(*cfg));
	for (i = 0; i < CFG_COUNT; i++) {
		config_set(cfg, err, (enum config_id)i, config_table[i].def, src_default,
			   "default", 0);
		snprintf(dashed[i], sizeof(dashed[i]), "%s", config_table[i].name);
		for (c = 0; dashed[i][c]; c++)
			if (dashed[i][c] == '_')
				dashed[i][c] = '-';
		opts[n++] =
		    (struct option){dashed[i], required_argument, NULL, OPT_SETTING + i};
		if (strcmp(dashed[i], config_table[i].name) != 0)
			opts[n++] = (struct option){config_table[i].name, required_argument,
						    NULL, OPT_SETTING + i};
	}
	opts[n++] = (struct option){"check-config", no_argument, NULL, OPT_CHECK};
	opts[n++] = (struct option){"version", no_argument, NULL, OPT_VERSION};
	opts[n++] = (struct option){"help", no_argument, NULL, OPT_HELP};
	opts[n++] = (struct option){"config", required_argument, NULL, 'c'};
	opts[n] = (struct option){NULL, 0, NULL, 0};

	optind = 1;
	while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
		if (c == 'c') {
			free(cfg->file);
			cfg->file = strdup(optarg);
		} else if (c == OPT_CHECK) {
			cfg->check_only = 1;
		} else if (c == OPT_VERSION) {
			printf("acemq-proxy %s\n", PACKAGE_VERSION);
			exit(0);
		} else if (c == OPT_HELP || c == 'h') {
			config_usage(stdout, argv[0]);
			exit(0);
		} else if (c >= OPT_SETTING && c < OPT_SETTING + CFG_COUNT) {
			cli_id[ncli] = c - OPT_SETTING;
			cli_val[ncli++] = optarg;
		} else {
			fprintf(err, "command line: unknown or incomplete option "
				     "(try --help)\n");
			cfg->nerrors++;
		}
	}
	if (optind < argc) {
		fprintf(err, "command line: unexpected argument '%s'\n", argv[optind]);
		cfg->nerrors++;
	}
	if (cfg->file)
		config_read_file(cfg, err, cfg->file);
	config_read_env(cfg, err);
	for (i = 0; i < ncli; i++) {
		char where[96];

		snprintf(where, sizeof(where), "command line --%s", dashed[cli_id[i]]);
		config_set(cfg, err, (enum config_id)cli_id[i], cli_val[i], src_cli, where, 1);
	}
	free(cli_val);
	free(cli_id);
	return cfg->nerrors;
}

void config_free(struct config *cfg)
{
	int i;

	for (i = 0; i < CFG_COUNT; i++)
		config_clear(&cfg->v[i]);
	free(cfg->file);
	cfg->file = NULL;
}

void config_dump(const struct config *cfg, FILE *out)
{
	int i, j;

	for (i = 0; i < CFG_COUNT; i++) {
		const struct config_value *v = &cfg->v[i];

		if (config_table[i].type == CFG_LIST) {
			for (j = 0; j < v->nlist; j++)
				fprintf(out, "%s = %s  # %s\n", config_table[i].name,
					v->list[j], v->source);
		} else if (config_table[i].type == CFG_SECRET) {
			fprintf(out, "%s = %s  # %s\n", config_table[i].name,
				v->str && v->str[0] ? "(set, not shown)" : "", v->source);
		} else {
			fprintf(out, "%s = %s  # %s\n", config_table[i].name,
				v->str ? v->str : "", v->source);
		}
	}
}

const char *config_str(const struct config *cfg, enum config_id id)
{
	return cfg->v[id].str ? cfg->v[id].str : "";
}

long config_num(const struct config *cfg, enum config_id id)
{
	return cfg->v[id].num;
}
