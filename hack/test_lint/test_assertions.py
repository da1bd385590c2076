"""Tests of assertions.py: what counts as a test that checks something."""

import unittest

import assertions


def unchecked(src):
    return [name for _, name in assertions.unchecked_tests({"t.rs": src})]


class UncheckedTests(unittest.TestCase):
    def test_a_test_that_only_prints_is_flagged(self):
        src = '#[tokio::test]\nasync fn a_test_that_prints() {\n    eprintln!("overlaps: {}", 3);\n}\n'
        self.assertEqual(unchecked(src), ["a_test_that_prints"])

    def test_an_assertion_in_a_comment_or_a_string_does_not_count(self):
        src = '#[test]\nfn looks_checked() {\n    // assert!(x)\n    let s = "assert_eq!(a, b)";\n    drop(s);\n}\n'
        self.assertEqual(unchecked(src), ["looks_checked"])

    def test_a_direct_assertion_or_expect_counts(self):
        src = ('#[test]\nfn asserts() { assert_eq!(1, 1); }\n'
               '#[test]\nfn expects() { let _ = std::fs::read("x").expect("read"); }\n')
        self.assertEqual(unchecked(src), [])

    def test_a_helper_that_asserts_counts_through_any_depth(self):
        src = ('fn leaf(x: u8) { assert!(x > 0); }\nfn middle() { leaf(1) }\n'
               '#[tokio::test]\nasync fn through_helpers() { middle(); }\n')
        self.assertEqual(unchecked(src), [])

    def test_a_helper_that_asserts_nothing_does_not_make_the_test_count(self):
        src = 'fn log(x: u8) { println!("{x}"); }\n#[test]\nfn only_logs() { log(1); }\n'
        self.assertEqual(unchecked(src), ["only_logs"])

    def test_a_non_test_function_is_never_flagged(self):
        self.assertEqual(unchecked("fn helper() { println!(\"x\"); }\n"), [])

    def test_braces_inside_strings_do_not_end_a_body_early(self):
        src = '#[test]\nfn braces() {\n    let s = "}";\n    assert!(s.len() == 1);\n}\n'
        self.assertEqual(unchecked(src), [])


if __name__ == "__main__":
    unittest.main()
