// Asio's and Beast's compiled parts (sockets, timers, TLS, the HTTP parser), built once here: the
// build defines BOOST_ASIO_SEPARATE_COMPILATION and BOOST_BEAST_SEPARATE_COMPILATION, so the files
// that include their headers get declarations, not another inline copy to optimise.
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
