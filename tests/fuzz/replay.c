/* replay: run each file named on the command line (or each file in a named
 * directory) through a fuzz target's entry point, without libFuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* A target may check each input after it ran (what a seed must reach),
 * and a corpus's replay at its end: non-zero fails the replay. The names
 * are this driver's, the same for every target that defines them. */
int fuzz_replayed(const char *path) __attribute__((weak));
int fuzz_replay_done(void) __attribute__((weak));

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	if (f == NULL) {
		perror(path);
		return -1;
	}
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc(n > 0 ? (size_t)n : 1);
	if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		free(buf);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)n);
	free(buf);
	return fuzz_replayed ? fuzz_replayed(path) : 0;
}

int main(int argc, char **argv)
{
	int i, count = 0, bad = 0;

	for (i = 1; i < argc; i++) {
		struct stat st;

		if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
			DIR *d = opendir(argv[i]);
			struct dirent *e;
			char path[4096];

			while (d && (e = readdir(d)) != NULL) {
				if (e->d_name[0] == '.')
					continue;
				snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
				bad += replay_file(path) != 0;
				count++;
			}
			if (d)
				closedir(d);
		} else {
			bad += replay_file(argv[i]) != 0;
			count++;
		}
	}
	/* A corpus, not one file (a crash being looked at). */
	if (count > 1 && fuzz_replay_done && fuzz_replay_done() != 0)
		bad++;
	printf("%s: replayed %d inputs\n", argv[0], count);
	return bad ? 1 : 0;
}
