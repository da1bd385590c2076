"""hack/image/dockerfile.py: python3 -m unittest discover -s hack/image"""

import os
import unittest

from dockerfile import final_stage, instructions

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(text):
    return final_stage(text.splitlines(keepends=True))


class InstructionsTest(unittest.TestCase):
    def test_continuations_join_and_comments_inside_them_are_dropped(self):
        text = "FROM a\n# a comment\nRUN one \\\n  # inside\n  two\n\n   \nUSER x\n"
        self.assertEqual(instructions(text.splitlines(keepends=True)),
                         ["FROM a", "RUN one    two", "USER x"])


class FinalStageTest(unittest.TestCase):
    def test_only_the_last_stage_counts(self):
        got = parse("FROM build AS b\nUSER 0\nEXPOSE 1\nFROM run\nUSER 65532:65532\n")
        self.assertEqual(got, [("USER", "65532:65532")])

    def test_entrypoint_exec_form_and_shell_form(self):
        self.assertEqual(parse('FROM a\nENTRYPOINT ["/bin/x", "--flag"]\n'), [("ENTRYPOINT", "/bin/x --flag")])
        self.assertEqual(parse("FROM a\nentrypoint /bin/x --flag\n"), [("ENTRYPOINT", "/bin/sh -c /bin/x --flag")])

    def test_expose_defaults_to_tcp_and_keeps_a_given_protocol(self):
        self.assertEqual(parse("FROM a\nEXPOSE 10271 53/udp\n"), [("EXPOSE", "10271/tcp"), ("EXPOSE", "53/udp")])

    def test_copy_is_its_destination(self):
        self.assertEqual(parse("FROM a\nCOPY --from=build /out/netcm /usr/local/bin/netcm\n"),
                         [("COPY", "/usr/local/bin/netcm")])

    def test_label_and_env_give_one_pair_a_line_with_quotes_removed(self):
        got = parse('FROM a\nLABEL a="one two" \\\n      b=3\nENV X=1 Y=2\n')
        self.assertEqual(got, [("LABEL", "a=one two"), ("LABEL", "b=3"), ("ENV", "X=1"), ("ENV", "Y=2")])

    def test_other_instructions_are_ignored(self):
        self.assertEqual(parse("FROM a\nWORKDIR /w\nRUN x\nARG V=1\n"), [])

    def test_the_repository_dockerfile(self):
        with open(os.path.join(HERE, "..", "..", "Dockerfile")) as f:
            got = final_stage(f)
        self.assertIn(("ENTRYPOINT", "/usr/local/bin/netcm"), got)
        self.assertIn(("USER", "65532:65532"), got)
        self.assertIn(("EXPOSE", "10271/tcp"), got)
        self.assertIn(("COPY", "/usr/local/bin/netcm"), got)
        self.assertIn(("LABEL", "org.opencontainers.image.title=netcm"), got)
        # netcm allocates with jemalloc (settings compiled in): no glibc malloc setting belongs here.
        self.assertEqual([v for k, v in got if k == "ENV" and v.startswith("MALLOC_")], [])


if __name__ == "__main__":
    unittest.main()
